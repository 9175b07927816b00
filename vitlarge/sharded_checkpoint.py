"""What `vitlarge.checkpoint` and `vitlarge.export` need to know about a sharded (FSDP) model.

A checkpoint of an ``fsdp`` run holds the same files as a ``ddp`` one, except that the optimizer
state is written by every rank for its own shard (``optimizer_rank_00000.pt`` ...; tensors and
numbers only, each parameter's state being this rank's piece of it, possibly empty), and
``model.safetensors`` is the full, unsharded model gathered to rank 0 (so the checkpoint's weights
and the export load in timm as they are). Resuming it is bitwise exact at the same world size
(each rank reloads its own pieces; the weights are re-sharded from the full tensors, which are
the fp32 masters bit for bit). At another world size, or from/to a ``ddp`` checkpoint, every rank
reads all the saved optimizer files, rebuilds each parameter's whole (unflattened) LAMB state
(`full_optimizer_state`: the pieces of one tensor lie in rank order, each rank's flat shard being
a contiguous slice of its unit's flat parameter) and loads it through FSDP's public
``optim_state_dict_to_load``, which cuts this rank's new pieces: exact, bit for bit. It costs one
unsharded copy of the optimizer state in host memory per rank, once, at the resume.

Every function taking a model is a collective under FSDP: call it on every rank.
"""

from __future__ import annotations

import math

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
    if not is_sharded(model):
        return None  # and no import of vitlarge.fsdp (Colossal-AI's Booster: seconds, and it draws from `random`)
    from vitlarge.fsdp import FULL_SHAPES_ATTR

    return getattr(_root(model), FULL_SHAPES_ATTR, None)


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


def optimizer_sources(files: dict, model: nn.Module, rank: int, world: int, saved_world: int) -> tuple[list[str], bool]:
    """The optimizer files this rank reads from a checkpoint listing ``files``, and whether they must be
    re-sharded (another world size, or ddp <-> fsdp) rather than loaded as they are."""
    if FULL_OPTIMIZER in files:
        return [FULL_OPTIMIZER], is_sharded(model)
    if is_sharded(model) and saved_world == world:
        return [SHARDED_OPTIMIZER.format(rank=rank)], False
    return [SHARDED_OPTIMIZER.format(rank=r) for r in range(saved_world)], True


def param_names(model: nn.Module, opt) -> list[str]:
    """The state-dict name of every optimizer parameter, in the order of the optimizer state dict's indices."""
    from torch.distributed.fsdp._common_utils import FSDP_WRAPPED_MODULE

    names = {id(p): n.replace(f"{FSDP_WRAPPED_MODULE}.", "") for n, p in _root(model).named_parameters()}
    return [names[id(p)] for group in opt.param_groups for p in group["params"]]


def full_optimizer_state(path, states: list[dict], shapes: list[list[int]]) -> dict:
    """An optimizer state dict with whole tensors (as a ddp run saves) from every rank's shard of it
    (in rank order). ``shapes``: each parameter's full shape, by index; ``path`` names the checkpoint."""
    whole = {}
    for i, shape in enumerate(shapes):
        held = [s["state"][i] for s in states if i in s["state"]]  # ranks without a piece hold no state
        if not held:
            continue
        whole[i] = {}
        for key, value in held[0].items():
            if torch.is_tensor(value) and value.dim() > 0:
                flat = torch.cat([h[key].reshape(-1) for h in held])
                if flat.numel() != math.prod(shape):
                    raise UserError(f"checkpoint {path}: the optimizer shards hold {flat.numel()} values of "
                                    f"'{key}' for parameter {i}, its shape {shape} needs {math.prod(shape)}; "
                                    "resume an older checkpoint")
                value = flat.reshape(shape)
            whole[i][key] = value
    return {"state": whole, "param_groups": states[0]["param_groups"]}


def load_optimizer(path, states: list[dict], from_ddp: bool, reshard: bool, model: nn.Module, optimizer) -> None:
    """Loads the optimizer state dicts read from the files ``optimizer_sources`` named (a ddp run's whole
    one when ``from_ddp``): as they are, or re-sharded for this run. A collective under fsdp."""
    opt = getattr(optimizer, "optim", optimizer)
    if not reshard:
        opt.load_state_dict(states[0])
        return
    names = param_names(model, opt)
    shapes = full_shapes(model) or {k: list(v.shape) for k, v in _root(model).state_dict().items()}
    whole = states[0] if from_ddp else full_optimizer_state(path, states, [shapes[n] for n in names])
    if not is_sharded(model):
        opt.load_state_dict(whole)
        return
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    by_name = {"state": {names[i]: s for i, s in whole["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in whole["param_groups"]]}
    opt.load_state_dict(FSDP.optim_state_dict_to_load(_root(model), opt, by_name))
