"""``train.activation_checkpointing``: which block activations a training step keeps for backward, and which it
recomputes.

* ``off``: autograd keeps every activation a block's backward reads.
* ``full``: each block keeps only its input and reruns its whole forward in backward (timm's
  ``set_grad_checkpointing``: ``checkpoint_seq`` over the blocks, non-reentrant). Least memory; one more forward
  of the blocks per step (up to 4/3 of the work).
* ``selective``: each block runs under ``torch.utils.checkpoint`` with a policy
  (``create_selective_checkpoint_contexts``) that keeps the outputs of its matrix multiplies and attention
  (`SAVED_OPS`) and recomputes everything between them: LayerNorms, GELU, dropout, residual adds, the copies of
  autocast. The recompute then costs elementwise work, no GEMM. The memory saved is what those cheap ops' outputs
  and inputs took: ViT-S/16 at 128 px (fp32, CPU) keeps 0.48x of ``off``'s activations, ``full`` 0.046x
  (docs/PERFORMANCE.md section 12).

Every mode computes the same numbers: the recomputed ops see the same inputs, and dropout the same random
state (the checkpoint restores it), so losses and gradients equal ``off``'s (tests/unit/model/test_recompute.py).
The blocks keep their parameters, names and state dict (their class is swapped for a subclass, as
`vitlarge.model.vit.Fp32Conv2d` is), so checkpoints do not depend on the mode. A block compiled on its own
(``train.compile_scope=blocks``) or inside the model compiles the checkpoint with it: Dynamo traces it as one
higher-order op and the selective policy becomes the partitioner's save/recompute tags.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, cast

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from vitlarge.errors import UserError
from vitlarge.model.blocks import transformer_blocks

MODES = ("off", "full", "selective")
Mode = Literal["off", "full", "selective"]

_aten = torch.ops.aten
SAVED_OPS = frozenset(
    {
        _aten.mm.default,
        _aten.addmm.default,
        _aten.bmm.default,
        _aten.baddbmm.default,
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
    }
)
"""The ops whose outputs ``selective`` keeps: the GEMMs (a Linear is ``addmm`` or ``mm`` by the time the policy
sees it) and the fused attention kernels (their output and log-sum-exp; the unfused path, taken with attention
dropout on a CPU, is ``bmm``s and a softmax). torchtitan's op-level policy keeps the same family."""


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    """``context_fn`` of the checkpoint: a plain function, the form Dynamo traces."""
    return create_selective_checkpoint_contexts(_policy)


_CLASSES: dict[type, type] = {}


def _selective_class(base: type) -> type:
    """``base`` whose forward runs under the selective checkpoint (one class per block class)."""
    if base in _CLASSES:
        return _CLASSES[base]

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        run = functools.partial(base.forward, self)
        out = checkpoint(run, x, *args, use_reentrant=False, context_fn=_selective_context, **kwargs)
        return cast(torch.Tensor, out)  # checkpoint returns the block's output (annotated Any)

    cls = type(
        base.__name__, (base,), {"forward": forward, "__module__": base.__module__, "__qualname__": base.__qualname__}
    )
    _CLASSES[base] = cls
    return cls


def apply(model: nn.Module, mode: Mode) -> None:
    """Sets ``model``'s recomputation to ``mode`` (in place, on a model built without any)."""
    if mode == "full":
        cast(Any, model).set_grad_checkpointing(True)  # every timm model has it; nn.Module does not declare it
    elif mode == "selective":
        blocks = transformer_blocks(model)
        if not blocks:
            raise UserError(
                f"train.activation_checkpointing=selective checkpoints transformer blocks one by one; "
                f"{type(model).__name__} has no timm Block: use train.activation_checkpointing=full or off"
            )
        for block in blocks:
            block.__class__ = _selective_class(type(block))
