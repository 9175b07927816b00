"""What `vitlarge.checkpoint` and `vitlarge.export` need to know about a sharded (FSDP) model.

A checkpoint of an ``fsdp`` run holds the same files as a ``ddp`` one, except that the optimizer
state is written by every rank for its own shard (``optimizer_rank_00000.pt`` ...; tensors and
numbers only, each parameter's state being this rank's piece of it, possibly empty), and
``model.safetensors`` is the full, unsharded model gathered to rank 0 (so the checkpoint's weights
and the export load in timm as they are). Resuming it is bitwise exact at the same world size
(each rank reloads its own pieces; the weights are re-sharded from the full tensors, which are
the fp32 masters bit for bit). At another world size, or from/to a ``ddp`` checkpoint, the
optimizer's pieces do not map onto the new shards: refused with one line (not supported yet).

Every function taking a model is a collective under FSDP: call it on every rank.
"""

from __future__ import annotations

import torch
from torch import nn

from vitlarge.errors import UserError

SHARDED_OPTIMIZER = "optimizer_rank_{rank:05d}.pt"
FULL_OPTIMIZER = "optimizer.pt"


def _root(model: nn.Module) -> nn.Module:
    return model.unwrap() if hasattr(model, "unwrap") else model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return isinstance(_root(model), FSDP)


def inner(model: nn.Module) -> nn.Module:
    """The timm model itself (for its config and attributes), under any wrapper."""
    root = _root(model)
    return root.module if is_sharded(model) else root


def full_shapes(model: nn.Module) -> dict[str, list[int]] | None:
    """The unsharded state dict's shapes, recorded when FSDP wrapped the model; None unless sharded."""
    from vitlarge.fsdp import FULL_SHAPES_ATTR

    return getattr(_root(model), FULL_SHAPES_ATTR, None) if is_sharded(model) else None


def model_tensors(model: nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """The full state dict on CPU on rank 0 (gathered from the shards under FSDP), ``{}`` elsewhere."""
    root = _root(model)
    if not is_sharded(model):
        return {k: v.detach().contiguous().cpu() for k, v in root.state_dict().items()} if rank == 0 else {}
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    # offload_to_cpu only from a GPU: on a CPU model torch 2.5 then clones freed memory (segfault, measured).
    on_gpu = next(root.parameters()).device.type != "cpu"
    with FSDP.state_dict_type(root, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=on_gpu, rank0_only=True)):
        state = root.state_dict()  # every rank: the gather is a collective
    return {k: v.detach().contiguous().cpu() for k, v in state.items()} if rank == 0 else {}


def load_model(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Loads a full state dict (every rank passes the same); FSDP keeps this rank's shard of it."""
    _root(model).load_state_dict(tensors)


def optimizer_files(model: nn.Module, optimizer, rank: int) -> dict[str, dict]:
    """File name -> optimizer state dict this rank writes: its shard's under FSDP, else rank 0 the whole."""
    opt = getattr(optimizer, "optim", optimizer)
    if is_sharded(model):
        return {SHARDED_OPTIMIZER.format(rank=rank): opt.state_dict()}
    return {FULL_OPTIMIZER: opt.state_dict()} if rank == 0 else {}


def optimizer_file(path, files: dict, model: nn.Module, rank: int, world: int, saved_world: int) -> str:
    """The optimizer file this rank loads from a checkpoint listing ``files``; a one-line ``UserError``
    where the checkpoint's layout does not fit this run (sharded vs not, another world size)."""
    saved_sharded = FULL_OPTIMIZER not in files
    if saved_sharded != is_sharded(model):
        saved, now = ("fsdp", "ddp") if saved_sharded else ("ddp", "fsdp")
        raise UserError(f"checkpoint {path} was written by train.plugin={saved}, this run uses {now}: its optimizer "
                        f"state does not fit; resume with train.plugin={saved} (or start a new --workdir)")
    if not saved_sharded:
        return FULL_OPTIMIZER
    if saved_world != world:
        raise UserError(f"checkpoint {path} holds optimizer shards for {saved_world} processes, this run has {world}; "
                        f"resume with {saved_world} processes (resharding to another world size is not supported yet)")
    return SHARDED_OPTIMIZER.format(rank=rank)
