"""Weights and optimizer state through ``torch.distributed.checkpoint`` (DCP), for any wrapper and world size.

A checkpoint (format 3, see vitlarge/checkpoint/store.py) stores the model and optimizer state dicts that
``torch.distributed.checkpoint.state_dict.get_state_dict`` returns, under the keys ``model`` and
``optimizer``: plain tensors under DDP, this rank's shards (DTensor under FSDP2, ShardedTensor/DTensor
under FSDP1) when sharded; with a model EMA (`vitlarge.model.ema`) its average under ``ema``, by the model's
names and sharded like the weights. ``dcp.save`` writes one ``__<rank>_0.distcp`` file per rank (replicated
tensors are written once, by one rank) and rank 0 the ``.metadata`` index; at resume ``dcp.load``
fills this run's own state dict, so each rank reads only the byte ranges its shards need, at any world
size and across ddp <-> fsdp (the fully qualified names are the same). Loading copies bits: exact.

Trust: DCP reads non-tensor leaves (learning rates, betas) with ``torch.load``; our planner does so
with ``weights_only=True``, and the ``.metadata`` index is unpickled by a restricted unpickler that
admits only DCP's own metadata classes and torch's dtypes/sizes (`_MetadataUnpickler`).

Format 2 (``model.safetensors`` + ``optimizer.pt`` or ``optimizer_rank_NNNNN.pt``, FSDP1 flat pieces)
is still read: `load_legacy` rebuilds full tensors and loads them through ``set_state_dict``.

Every function taking a model is a collective when the model is sharded: call it on every rank.
"""

from __future__ import annotations

import contextlib
import io
import math
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from vitlarge.errors import UserError

SHARDED_OPTIMIZER = "optimizer_rank_{rank:05d}.pt"  # format 2
FULL_OPTIMIZER = "optimizer.pt"  # format 2
METADATA = ".metadata"  # DCP's index, written by the coordinator (rank 0)


def dcp_files_of(rank: int, folder: Path) -> list[str]:
    """The files ``dcp.save`` wrote for ``rank`` in ``folder`` (its ``.distcp`` data, and rank 0 the index)."""
    names = sorted(p.name for p in folder.glob(f"__{rank}_*.distcp"))
    return names + ([METADATA] if rank == 0 else [])


def _root(model: nn.Module) -> nn.Module:
    """The module whose state dict has the model's own names: under a Booster wrapper and torch's DDP
    (whose replicas are the module itself); an FSDP1 root stays (its state dict is the collective one)."""
    from torch.nn.parallel import DistributedDataParallel

    model = model.unwrap() if hasattr(model, "unwrap") else model
    return model.module if isinstance(model, DistributedDataParallel) else model


def _optim(optimizer):
    return getattr(optimizer, "optim", optimizer)  # Colossal-AI's OptimizerWrapper holds the torch optimizer


def _is_fsdp1(root: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(root, FullyShardedDataParallel)


def is_sharded(model: nn.Module) -> bool:
    """FSDP2 (``fully_shard``: DTensor parameters) or an FSDP1 root. Never a collective."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    root = _root(model)
    return isinstance(root, FSDPModule) or _is_fsdp1(root) or any(isinstance(p, DTensor) for p in root.parameters())


def inner(model: nn.Module) -> nn.Module:
    """The timm model itself (for its config and attributes), under any wrapper."""
    root = _root(model)
    return root.module if _is_fsdp1(root) else root


def full_shapes(model: nn.Module) -> dict[str, list[int]] | None:
    """The unsharded state dict's shapes without a collective; None when ``model.state_dict()`` has them
    (DDP: plain tensors; FSDP2: DTensors report their global shape). FSDP1 records them when it wraps."""
    root = _root(model)
    if not _is_fsdp1(root):
        return None  # and no import of vitlarge.distributed.fsdp (Colossal-AI's Booster: seconds, and it draws from `random`)
    from vitlarge.distributed.fsdp import FULL_SHAPES_ATTR

    return getattr(root, FULL_SHAPES_ATTR, None)


def model_tensors(model: nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """The full state dict on CPU on rank 0 (gathered from the shards when sharded), ``{}`` elsewhere."""
    root = _root(model)
    if not is_sharded(model):
        return {k: v.detach().contiguous().cpu() for k, v in root.state_dict().items()} if rank == 0 else {}
    # cpu_offload: gathered on rank 0 only (the others get {}), each tensor moved to the host as it comes.
    # Not for an FSDP1 model on the CPU: FSDP1 then clones freed memory (segfault, measured on torch 2.10).
    offload = not _is_fsdp1(root) or next(root.parameters()).device.type != "cpu"
    state = get_model_state_dict(root, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    return {k: v.detach().contiguous().cpu() for k, v in state.items()} if rank == 0 else {}


def _state(model: nn.Module, optimizer, with_optimizer: bool) -> dict:
    root = _root(model)
    if not with_optimizer:
        return {"model": get_model_state_dict(root)}
    model_state, optim_state = get_state_dict(root, _optim(optimizer))
    return {"model": model_state, "optimizer": optim_state}


def has_optimizer_state(optimizer) -> bool:
    """Whether the optimizer has stepped. ``get_state_dict`` would give a fresh one state by a step with
    zero gradients (step counters 1): a save of it writes the weights only, so its resume stays exact."""
    return bool(_optim(optimizer).state)


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns on every save/load without a process group ("assuming the intent is to ... in a single
    process"): that is our intent (one-process runs, evaluation, init_from)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*assuming the intent is to (save|load) in a single process")
        yield


def save(folder: Path, model: nn.Module, optimizer, with_optimizer: bool, ema: dict | None = None) -> None:
    """Every rank: writes its shards of the model (and optimizer) state, and of the EMA average ``ema`` if
    given, into ``folder``. DCP fsyncs each file it writes (``sync_files``); the caller fsyncs the folder and
    publishes it."""
    writer = dcp.FileSystemWriter(str(folder), single_file_per_rank=True, sync_files=True)
    state = _state(model, optimizer, with_optimizer)
    if ema is not None:
        state["ema"] = ema
    with _quiet_single_process():
        dcp.save(state, storage_writer=writer, no_dist=not dist.is_initialized())


class _WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's planner, reading non-tensor leaves with ``weights_only=True`` (DCP's own unpickles objects),
    and without its guess at pre-2.4 checkpoints: a checkpoint key this rank does not hold (FSDP1 leaves
    out the optimizer state of a parameter of which a rank holds no piece) made it re-flatten the state
    dict the old way, which then misses ``optimizer.param_groups``. Every key this rank holds must still
    be in the checkpoint (strict)."""

    def create_local_plan(self):
        from torch.distributed.checkpoint.default_planner import create_default_local_load_plan

        return create_default_local_load_plan(self.state_dict, self.metadata, not self.allow_partial_load)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` admitting only its metadata classes and torch's dtypes and sizes."""

    ALLOWED_MODULES = ("torch.distributed.checkpoint.", "collections", "torch._utils", "torch.serialization")

    def find_class(self, module: str, name: str):
        if module == "torch" and (name in ("Size", "device") or isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        if module == "torch" and name in ("strided", "sparse_coo", "preserve_format", "contiguous_format"):
            return super().find_class(module, name)
        if module == "pathlib" and name in ("Path", "PosixPath", "PurePosixPath"):  # the writer's checkpoint_id
            return super().find_class(module, name)
        if module == "builtins" and name in ("set", "frozenset", "tuple", "list", "dict", "getattr"):
            return super().find_class(module, name)
        if module.startswith(self.ALLOWED_MODULES) or module == "torch.distributed.checkpoint":
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{METADATA} refers to {module}.{name}, which a DCP index never holds")


class Reader(dcp.FileSystemReader):
    """DCP's file-system reader with a restricted unpickler for the ``.metadata`` index."""

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import StorageMeta

        with open(Path(self.path) / METADATA, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def load(folder: Path, model: nn.Module, optimizer, with_optimizer: bool, ema: dict | None = None) -> None:
    """Every rank: fills this run's model (and optimizer) state from ``folder``, reading only its shards, and
    the EMA average ``ema`` in place when given (the checkpoint must hold one)."""
    state = _state(model, optimizer, with_optimizer)
    if ema is not None:
        state["ema"] = ema
    with _quiet_single_process():
        dcp.load(
            state, storage_reader=Reader(folder), planner=_WeightsOnlyLoadPlanner(), no_dist=not dist.is_initialized()
        )
    if with_optimizer:
        set_state_dict(
            _root(model), _optim(optimizer), model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
    else:
        set_state_dict(_root(model), [], model_state_dict=state["model"], optim_state_dict={})


def read_full_model(
    folder: Path, like: dict[str, torch.Tensor] | None = None, key: str = "model"
) -> dict[str, torch.Tensor]:
    """The whole model state dict of a format-3 checkpoint, on the CPU of this process alone (no
    collective, reads the model's bytes only). ``like``: tensors to fill (a plain model's state dict);
    by default allocated from the index's shapes and dtypes. ``key="ema"``: the EMA average instead."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if like is None:
        index = Reader(folder).read_metadata().state_dict_metadata
        like = {
            k.removeprefix(f"{key}."): torch.empty(md.size, dtype=md.properties.dtype)
            for k, md in index.items()
            if k.startswith(f"{key}.") and isinstance(md, TensorStorageMetadata)
        }
    state = {key: like}
    with _quiet_single_process():
        dcp.load(state, storage_reader=Reader(folder), planner=_WeightsOnlyLoadPlanner(), no_dist=True)
    return state[key]


# Format 2 --------------------------------------------------------------------------------------------


def legacy_optimizer_sources(files: dict) -> list[str]:
    """The optimizer files of a format-2 checkpoint listing ``files``: ddp's whole one, or every rank's shard."""
    if FULL_OPTIMIZER in files:
        return [FULL_OPTIMIZER]
    return sorted(n for n in files if n.startswith("optimizer_rank_"))


def param_names(model: nn.Module, opt) -> list[str]:
    """The state-dict name of every optimizer parameter, in the order of the optimizer state dict's indices."""
    prefix = "_fsdp_wrapped_module."  # FSDP1's; FSDP2 and DDP (under `_root`) keep the model's names
    names = {id(p): n.replace(prefix, "") for n, p in _root(model).named_parameters()}
    return [names[id(p)] for group in opt.param_groups for p in group["params"]]


def full_optimizer_state(path, states: list[dict], shapes: list[list[int]]) -> dict:
    """An optimizer state dict with whole tensors (as a ddp run saves) from every rank's FSDP1 shard of it
    (in rank order: each rank's flat shard is a contiguous slice of its unit's flat parameter).
    ``shapes``: each parameter's full shape, by index; ``path`` names the checkpoint."""
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
                    raise UserError(
                        f"checkpoint {path}: the optimizer shards hold {flat.numel()} values of "
                        f"'{key}' for parameter {i}, its shape {shape} needs {math.prod(shape)}; "
                        "resume an older checkpoint"
                    )
                value = flat.reshape(shape)
            whole[i][key] = value
    return {"state": whole, "param_groups": states[0]["param_groups"]}


def load_legacy(path, tensors: dict, states: list[dict], from_ddp: bool, model: nn.Module, optimizer) -> None:
    """Loads a format-2 checkpoint's full weights and optimizer files (a ddp run's whole state, or every
    rank's FSDP1 shard) into this run, whatever its wrapper and world size: full tensors through
    ``set_state_dict(full_state_dict=True)``, which keeps this rank's shard. Exact (bit copies)."""
    opt = _optim(optimizer)
    names = param_names(model, opt)
    shapes = full_shapes(model) or {k: list(v.shape) for k, v in _root(model).state_dict().items()}
    whole = states[0] if from_ddp else full_optimizer_state(path, states, [shapes[n] for n in names])
    by_name = {
        "state": {names[i]: s for i, s in whole["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in whole["param_groups"]],
    }
    set_state_dict(
        _root(model),
        opt,
        model_state_dict=tensors,
        optim_state_dict=by_name,
        options=StateDictOptions(full_state_dict=True),
    )
