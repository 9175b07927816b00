"""Weights and optimizer state through ``torch.distributed.checkpoint`` (DCP), for any wrapper and world size.

A checkpoint (format 3, see vitlarge/checkpoint/store.py) stores the sharded parts a
`vitlarge.checkpoint.state.RunState` names (``sharded_parts``), each under its name: the model's state dict
(`Weights`, ``get_model_state_dict``) under ``model``, the optimizer's (`OptimizerState`,
``get_optimizer_state_dict``) under ``optimizer``, a model EMA's average (`vitlarge.model.ema`) under ``ema``: plain
tensors under DDP, this rank's shards (DTensor under FSDP2) when sharded, by the model's names. `save` and `load`
know no part by name. ``dcp.save`` writes one ``__<rank>_0.distcp`` file per rank (replicated
tensors are written once, by one rank) and rank 0 the ``.metadata`` index; at resume ``dcp.load``
fills this run's own state dicts, then each part takes its own back, so each rank reads only the byte ranges its
shards need, at any world size and across ddp <-> fsdp (the fully qualified names are the same). Loading copies
bits: exact.

Trust: a checkpoint is data from elsewhere. DCP reads tensors and non-tensor leaves (learning rates,
betas) with ``torch.load(weights_only=True)`` (our planner for the leaves); the ``.metadata`` index is read and
checked by vitlarge/checkpoint/trust/index.py before `Reader` hands it to DCP.

Formats 1 and 2 (``model.safetensors`` + ``optimizer.pt`` or ``optimizer_rank_NNNNN.pt``, FSDP1 flat pieces)
are still read, by vitlarge/checkpoint/legacy.py.

Every function taking a model is a collective when the model is sharded: call it on every rank.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, create_default_local_load_plan
from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from vitlarge.checkpoint.trust.index import METADATA, IndexProblem, read_index
from vitlarge.checkpoint.trust.meta import is_number
from vitlarge.distributed.plugins import unwrap
from vitlarge.errors import UserError


def dcp_files_of(rank: int, folder: Path) -> list[str]:
    """The files ``dcp.save`` wrote for ``rank`` in ``folder`` (its ``.distcp`` data, and rank 0 the index)."""
    names = sorted(p.name for p in folder.glob(f"__{rank}_*.distcp"))
    return names + ([METADATA] if rank == 0 else [])


def _optim(optimizer):
    return getattr(optimizer, "optim", optimizer)  # Colossal-AI's OptimizerWrapper holds the torch optimizer


def is_sharded(model: nn.Module) -> bool:
    """FSDP2 (``fully_shard``: DTensor parameters). Never a collective."""
    root = unwrap(model)
    return isinstance(root, FSDPModule) or any(isinstance(p, DTensor) for p in root.parameters())


def full_shapes(model: nn.Module) -> dict[str, list[int]]:
    """The unsharded state dict's shapes, without a collective (FSDP2's DTensors report their global shape)."""
    return {k: list(v.shape) for k, v in unwrap(model).state_dict().items()}


def model_tensors(model: nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """The full state dict on CPU on rank 0 (gathered from the shards when sharded), ``{}`` elsewhere."""
    root = unwrap(model)
    if not is_sharded(model):
        return {k: v.detach().contiguous().cpu() for k, v in root.state_dict().items()} if rank == 0 else {}
    # cpu_offload: gathered on rank 0 only (the others get {}), each tensor moved to the host as it comes.
    state = cast(
        "dict[str, torch.Tensor]",  # a model's state dict: tensors (DCP annotates any state dict's values)
        get_model_state_dict(root, options=StateDictOptions(full_state_dict=True, cpu_offload=True)),
    )
    return {k: v.detach().contiguous().cpu() for k, v in state.items()} if rank == 0 else {}


class Weights:
    """The model's weights as a `vitlarge.checkpoint.state.Stateful` of DCP's state-dict API: plain tensors under
    DDP, this rank's shards (DTensor) under FSDP2, by the model's own names under any wrapper."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(unwrap(self.model))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_model_state_dict(unwrap(self.model), state_dict)


class GroupsDiffer(Exception):
    """A saved optimizer state whose parameter groups hold settings this run's optimizer does not write."""


class OptimizerState:
    """The optimizer's state as a `vitlarge.checkpoint.state.Stateful` of DCP's state-dict API (by parameter name,
    sharded like the weights). Loading checks the saved groups' settings against the ones this optimizer writes
    (`param_groups_problem`) before any of them is set: `GroupsDiffer` when they differ."""

    def __init__(self, model: nn.Module, optimizer):
        self.model, self.optimizer = model, optimizer
        self._written: list[dict] = []

    def state_dict(self) -> dict[str, Any]:
        # DCP annotates the groups loosely (any state dict value): they are a list of dicts, as torch writes them
        state = cast("dict[str, Any]", get_optimizer_state_dict(unwrap(self.model), _optim(self.optimizer)))
        self._written = group_settings(state["param_groups"])
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        problem = param_groups_problem(self._written, state_dict["param_groups"])
        if problem:
            raise GroupsDiffer(problem)
        set_optimizer_state_dict(unwrap(self.model), _optim(self.optimizer), state_dict)


def has_optimizer_state(optimizer) -> bool:
    """Whether the optimizer has stepped. ``get_optimizer_state_dict`` would give a fresh one state by a step with
    zero gradients (step counters 1): a save of it writes the weights only, so its resume stays exact."""
    return bool(_optim(optimizer).state)


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns on every save/load without a process group ("assuming the intent is to ... in a single
    process"): that is our intent (one-process runs, evaluation, init_from)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*assuming the intent is to (save|load) in a single process")
        yield


def save(folder: Path, parts: Mapping[str, Stateful]) -> None:
    """Every rank: writes its shards of each part's state (`vitlarge.checkpoint.state.RunState.sharded_parts`: the
    weights, the optimizer state, the EMA average) under the part's name into ``folder``. DCP fsyncs each file it
    writes (``sync_files``); the caller fsyncs the folder and publishes it."""
    writer = dcp.FileSystemWriter(str(folder), single_file_per_rank=True, sync_files=True)
    saved = {name: part.state_dict() for name, part in parts.items()}
    with _quiet_single_process():
        dcp.save(saved, storage_writer=writer, no_dist=not dist.is_initialized())


class _WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's planner, reading non-tensor leaves with ``weights_only=True`` (DCP's own unpickles objects),
    and without its guess at pre-2.4 checkpoints: a checkpoint key this rank does not hold (FSDP1 leaves
    out the optimizer state of a parameter of which a rank holds no piece) made it re-flatten the state
    dict the old way, which then misses ``optimizer.param_groups``. Every key this rank holds must still
    be in the checkpoint (strict)."""

    def create_local_plan(self):
        assert self.metadata is not None  # set_up_planner gave it the index
        return create_default_local_load_plan(self.state_dict, self.metadata, not self.allow_partial_load)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class Reader(dcp.FileSystemReader):
    """DCP's file-system reader of a checkpoint folder's index read as data (`read_index`): only the
    ``.distcp`` files meta.json lists, within their recorded sizes. ``files``: meta.json's records
    (read from the folder when not given); ``index``: the `read_index` the caller already made and checked
    (parsed once: a 1024-rank index takes seconds)."""

    def __init__(self, path, files: dict[str, dict] | None = None, index=None):
        super().__init__(path)
        self._files, self._index = files, index

    def read_metadata(self, *args, **kwargs):
        metadata = self._index if self._index is not None else read_index(Path(self.path), self._files)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def load(folder: Path, parts: Mapping[str, Stateful], files: dict | None = None, index=None) -> None:
    """Every rank: fills each part (`vitlarge.checkpoint.state.RunState.sharded_parts`) from its name's state in
    ``folder``, reading only its shards (the checkpoint must hold every part). ``files``, ``index``: see `Reader`."""
    loaded = {name: part.state_dict() for name, part in parts.items()}
    with _quiet_single_process():
        dcp.load(
            loaded,
            storage_reader=Reader(folder, files, index),
            planner=_WeightsOnlyLoadPlanner(),
            no_dist=not dist.is_initialized(),
        )
    try:
        for name, part in parts.items():
            part.load_state_dict(loaded[name])
    except GroupsDiffer as e:
        raise UserError(
            f"checkpoint {folder} holds optimizer settings this run's optimizer does not write ({e}); "
            "--resume another checkpoint, or start a new workdir with model.init_from=<the checkpoint>",
            same_on_all_ranks=True,
        ) from None


def group_settings(groups: list[dict]) -> list[dict]:
    """Each parameter group's settings (lr, betas, eps...: all but its parameters), copied."""
    return [{k: v for k, v in g.items() if k != "params"} for g in groups]


def _same_kind(written, loaded, any_run: bool = False) -> bool:
    """Whether ``loaded`` is of the kind ``written`` (what the optimizer writes) is: a bool for a bool, a finite
    number for a number (or for None, an optional number), a sequence of as many such for a sequence, else the
    same type. ``any_run``: also None for a number (an optional setting this recipe sets and another left unset)."""

    if isinstance(written, bool):
        return isinstance(loaded, bool)
    if is_number(written) or written is None:
        return is_number(loaded) or loaded is written or (any_run and loaded is None)
    if isinstance(written, (tuple, list)):
        return (
            isinstance(loaded, (tuple, list))
            and len(loaded) == len(written)
            and all(_same_kind(w, v, any_run) for w, v in zip(written, loaded))
        )
    return type(loaded) is type(written)


def param_groups_problem(written: list[dict], loaded: list[dict], any_run: bool = False) -> str | None:
    """Why a checkpoint's optimizer settings (``loaded``, each group's as DCP read them) are not of the kinds this
    run's optimizer writes (``written``: its own groups' before the load; `_same_kind`, with ``any_run``), or None.
    Checked before they reach the optimizer: ``eps='oops'`` otherwise passes every check and raises in the fused
    kernel at the first step."""
    if not isinstance(loaded, list) or len(loaded) != len(written):
        return f"{len(loaded) if isinstance(loaded, list) else 'no'} parameter groups, this run has {len(written)}"
    for i, (want, got) in enumerate(zip(written, loaded)):
        if not isinstance(got, dict):
            return f"param_groups[{i}] is not a map"
        for key, value in want.items():
            if key in got and not _same_kind(value, got[key], any_run):
                return (
                    f"param_groups[{i}].{key} is {str(got[key])[:40]!r}, a {type(got[key]).__name__}; it writes "
                    f"{value!r}, a {type(value).__name__}"
                )
    return None


def saved_groups_problem(folder: Path, optimizer, files: dict | None = None, index=None) -> str | None:
    """`param_groups_problem` of the optimizer settings a format-3 checkpoint holds against ``optimizer``'s own
    (the torch optimizer's groups, as ``get_optimizer_state_dict`` writes them), read on this process alone: only
    the settings' own small byte ranges, no collective, nothing loaded into the optimizer. Only values no run of
    this optimizer writes count (``any_run``: a checkpoint an automatic resume passes over must be damaged, not of
    another recipe); None also where the checkpoint holds another number of groups or none. The restore's own
    check (`load`) and `vitlarge.checkpoint.resume.check_edits` name those in one line. ``files``, ``index``: see
    `Reader`."""
    index = read_index(folder, files) if index is None else index
    written = group_settings(_optim(optimizer).param_groups)
    prefix = "optimizer.param_groups."
    saved: dict[str, set[str]] = {}
    for key in index.state_dict_metadata:
        if key.startswith(prefix):
            group, _, name = key.removeprefix(prefix).partition(".")
            saved.setdefault(group, set()).add(name)
    if set(saved) != {str(i) for i in range(len(written))}:
        return None
    groups: list[dict] = [{k: None for k in want if k in saved[str(i)]} for i, want in enumerate(written)]
    with _quiet_single_process():
        dcp.load(
            {"optimizer": {"param_groups": groups}},
            storage_reader=Reader(folder, files, index),
            planner=_WeightsOnlyLoadPlanner(),
            no_dist=True,
        )
    return param_groups_problem(written, groups, any_run=True)


def index_gap(index, meta: dict) -> str | None:
    """Why DCP's ``index`` lacks, or holds at another shape, an entry the restore asks for, or None (metadata
    only, no tensor read): every parameter meta.json's ``param_shapes`` names, under ``model.`` and (meta.json's
    ``ema``) ``ema.``, of that shape; with its optimizer state (``optimizer_state``), the same state names for every
    parameter that has any (LAMB and AdamW: ``step``, ``exp_avg``, ``exp_avg_sq``), each tensor of more than one
    element of its parameter's shape. DCP's load would stop on each, on every requeue ("Missing key ...")."""
    entries = index.state_dict_metadata
    shapes = {name: list(shape) for name, shape in meta["param_shapes"].items()}

    def shape_problem(key: str, want: list[int]) -> str | None:
        md = entries.get(key)
        if not isinstance(md, TensorStorageMetadata):
            return f"{METADATA} lacks {key}, which the restore reads"
        if list(md.size) != want:
            return f"{METADATA} holds {key} of shape {list(md.size)}, meta.json's param_shapes say {want}"
        return None

    for part in ("model", "ema") if meta.get("ema", False) else ("model",):
        for name, want in shapes.items():
            problem = shape_problem(f"{part}.{name}", want)
            if problem:
                return problem
    if not meta.get("optimizer_state", True):
        return None
    prefix = "optimizer.state."
    state: dict[str, set[str]] = {}
    for key in entries:
        if key.startswith(prefix):
            name, _, moment = key.removeprefix(prefix).rpartition(".")
            state.setdefault(name, set()).add(moment)
    moments = set().union(*state.values()) if state else set()
    for name, want in shapes.items():
        for moment in sorted(moments) if name in state else []:
            key = f"{prefix}{name}.{moment}"
            md = entries.get(key)
            if md is None:
                return f"{METADATA} lacks {key}, which the restore reads"
            if isinstance(md, TensorStorageMetadata) and md.size.numel() > 1:
                problem = shape_problem(key, want)
                if problem:
                    return problem
    return None


def read_full_model(
    folder: Path,
    like: dict[str, torch.Tensor] | None = None,
    key: str = "model",
    files: dict | None = None,
    index=None,
) -> dict[str, torch.Tensor]:
    """The whole model state dict of a format-3 checkpoint, on the CPU of this process alone (no
    collective, reads the model's bytes only). ``like``: tensors to fill (a plain model's state dict);
    by default allocated from the index's shapes and dtypes. ``key="ema"``: the EMA average instead.
    ``files``, ``index``: see `Reader`."""
    index = read_index(folder, files) if index is None else index
    if like is None:
        try:
            like = {
                k.removeprefix(f"{key}."): torch.empty(md.size, dtype=md.properties.dtype)
                for k, md in index.state_dict_metadata.items()
                if k.startswith(f"{key}.") and isinstance(md, TensorStorageMetadata)
            }
        except RuntimeError as e:  # the index's shapes are bounded by the files' sizes, not by this machine's memory
            raise IndexProblem(
                f"{METADATA}'s tensors do not fit in memory here ({str(e).splitlines()[0][:80]})"
            ) from None
    state = {key: like}
    with _quiet_single_process():
        dcp.load(state, storage_reader=Reader(folder, files, index), planner=_WeightsOnlyLoadPlanner(), no_dist=True)
    return state[key]


def param_names(model: nn.Module, opt) -> list[str]:
    """The state-dict name of every optimizer parameter, in the order of the optimizer state dict's indices."""
    names = {id(p): n for n, p in unwrap(model).named_parameters()}  # FSDP2 and DDP keep the model's names
    return [names[id(p)] for group in opt.param_groups for p in group["params"]]
