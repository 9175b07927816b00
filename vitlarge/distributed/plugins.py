"""The Colossal-AI Booster plugin a recipe asks for, on the device ``launch.choose_device`` chose.

``ddp`` (TorchDDPPlugin) replicates the model; ``fsdp`` (`vitlarge.distributed.fsdp.FSDPPlugin`) shards weights,
gradients and LAMB states over the ranks, for models whose states do not fit next to the weights
(ViT-H/14 and up). Both run on CPU (gloo) and CUDA (NCCL). Under ``fsdp`` the plugin owns the
compute precision (FSDP2's casts, no autocast); the fp16 loss scaler's overflow check then spans all ranks.

Device: the DDP plugin moves the model to Colossal-AI's "current device" (``colossalai.utils.
get_current_device()``, i.e. its global accelerator, which it detects as CUDA whenever CUDA is
available). ``build_plugin`` sets that accelerator from our device, so ``train.device=cpu`` on a
CUDA host keeps the model on the CPU, next to its data, autocast and gloo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch

from vitlarge.config.schema import Config

if TYPE_CHECKING:
    from vitlarge.distributed.booster import Plugin

DDP_BUCKET_CAP_MB = 25
"""DDP's gradient bucket size: ViT-B/16's 86M fp32 gradients go out in ~14 all-reduces."""


def build_plugin(cfg: Config, device: torch.device | str, precision: str) -> Plugin:
    """The plugin for ``cfg.train.plugin``; ``device`` (a ``torch.device``) becomes Colossal-AI's current device;
    ``precision``: the resolved one (`vitlarge.train.settings.Settings.precision`), fsdp's mixed precision.

    For CUDA, the index is the one ``launch.choose_device`` made current with ``torch.cuda.set_device``."""
    from colossalai.accelerator import set_accelerator  # lazy: keeps Colossal-AI off the GPU kit (its own booster)

    set_accelerator(torch.device(device).type)
    if cfg.train.plugin == "ddp":
        from vitlarge.distributed.booster import TorchDDPPlugin  # lazy: keeps Colossal-AI off the GPU kit

        # One bucket per ~25 MB: ViT-B/16's 86M fp32 gradients go out in ~14 all-reduces, overlapped
        # with the last micro-step's backward; earlier micro-steps run under no_sync.
        return TorchDDPPlugin(bucket_cap_mb=DDP_BUCKET_CAP_MB, broadcast_buffers=False)
    from vitlarge.distributed.fsdp import FSDPPlugin  # lazy: keeps Colossal-AI off the GPU kit (its own booster)

    return FSDPPlugin(precision, torch.device(device))


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model under the wrappers the Booster and its plugin put around it (the Booster's ``ModelWrapper``, torch's
    DDP, whose replica is the module itself): the module whose state dict has the model's own names. An FSDP2 root
    is the model itself, sharded in place."""
    from torch.nn.parallel import DistributedDataParallel  # lazy: keeps torch off the import of this module

    model = cast(Any, model).unwrap() if hasattr(model, "unwrap") else model  # the Booster's ModelWrapper
    return model.module if isinstance(model, DistributedDataParallel) else model
