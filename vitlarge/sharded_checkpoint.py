"""What `vitlarge.checkpoint` and `vitlarge.export` need to know about a sharded (FSDP2) model.

A checkpoint of an ``fsdp`` run holds the same files as a ``ddp`` one, except that the optimizer
state is written by every rank for its own shard (``optimizer_rank_00000.pt`` ...; tensors and
numbers only, each parameter's state being this rank's piece of it: FSDP2 shards on dim 0, so a
piece is a run of rows, possibly empty), and ``model.safetensors`` is the full, unsharded model
gathered to rank 0 (so the checkpoint's weights and the export load in timm as they are). Resuming
it is bitwise exact at the same world size (each rank reloads its own pieces; the weights are
re-sharded from the full tensors, which are the fp32 masters bit for bit). At another world size,
or from/to a ``ddp`` checkpoint, every rank reads all the saved optimizer files, rebuilds each
parameter's whole LAMB state (`full_optimizer_state`: the pieces of one tensor, flattened, lie in
rank order) and loads it through ``torch.distributed.checkpoint.state_dict.set_optimizer_state_dict``
(``full_state_dict``), which cuts this rank's new pieces: exact, bit for bit. It costs one
unsharded copy of the optimizer state in host memory per rank, once, at the resume. The model's
full state dict is gathered and loaded with ``get_model_state_dict`` / ``set_model_state_dict``.

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
    from torch.distributed.fsdp import FSDPModule

    return isinstance(_root(model), FSDPModule)


def inner(model: nn.Module) -> nn.Module:
    """The timm model itself (for its config and attributes), under any wrapper (FSDP2 shards it in place)."""
    return _root(model)


def _local_state(state: dict) -> dict:
    """An optimizer state dict with this rank's pieces (plain tensors) in place of DTensors."""
    from torch.distributed.tensor import DTensor

    def piece(v):
        if not isinstance(v, DTensor):
            return v
        t = v.to_local()
        # torch.save writes a view's whole storage: copy a piece that is a view into a larger buffer.
        return t if t.untyped_storage().nbytes() == t.numel() * t.element_size() else t.clone()

    return {**state, "state": {i: {k: piece(v) for k, v in s.items()} for i, s in state["state"].items()}}


def _sharded_state(state: dict, params: list) -> dict:
    """``_local_state``'s inverse: this rank's pieces as DTensors placed like their parameters (by index)."""
    from torch.distributed.tensor import DTensor

    def place(p, v):
        if not isinstance(p, DTensor) or not torch.is_tensor(v) or v.dim() == 0:
            return v
        return DTensor.from_local(v, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())

    return {**state, "state": {i: {k: place(params[i], v) for k, v in s.items()} for i, s in state["state"].items()}}


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
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # full_state_dict + cpu_offload: gathered on rank 0 only, each tensor moved to the host as it comes.
    state = get_model_state_dict(root, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().contiguous().cpu() for k, v in state.items()} if rank == 0 else {}


def load_model(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Loads a full state dict (every rank passes the same); FSDP keeps this rank's shard of it."""
    if not is_sharded(model):
        _root(model).load_state_dict(tensors)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(_root(model), tensors, options=StateDictOptions(full_state_dict=True))


def optimizer_files(model: nn.Module, optimizer, rank: int) -> dict[str, dict]:
    """File name -> optimizer state dict this rank writes: its shard's under FSDP, else rank 0 the whole."""
    opt = getattr(optimizer, "optim", optimizer)
    if is_sharded(model):
        return {SHARDED_OPTIMIZER.format(rank=rank): _local_state(opt.state_dict())}
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
    names = {id(p): n for n, p in _root(model).named_parameters()}  # FSDP2 keeps the model's names
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
        params = [p for group in opt.param_groups for p in group["params"]]
        opt.load_state_dict(_sharded_state(states[0], params) if is_sharded(model) else states[0])
        return
    names = param_names(model, opt)
    shapes = full_shapes(model) or {k: list(v.shape) for k, v in _root(model).state_dict().items()}
    whole = states[0] if from_ddp else full_optimizer_state(path, states, [shapes[n] for n in names])
    if not is_sharded(model):
        opt.load_state_dict(whole)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    by_name = {"state": {names[i]: s for i, s in whole["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in whole["param_groups"]]}
    set_optimizer_state_dict(_root(model), opt, by_name, options=StateDictOptions(full_state_dict=True))
