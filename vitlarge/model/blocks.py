"""The transformer blocks of a model: the unit FSDP shards, ``train.compile_scope=blocks`` compiles and
``train.activation_checkpointing=selective`` checkpoints, one by one."""

from __future__ import annotations

from torch import nn


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """``model``'s timm ``Block`` modules (and subclasses), in forward order; [] for a model without them."""
    from timm.models.vision_transformer import Block  # lazy: keeps timm off a run's pre-flight checks

    return [m for m in model.modules() if isinstance(m, Block)]
