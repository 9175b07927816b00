"""Formats 1 and 2, the one adapter: what vitlarge wrote before DCP (format 3) still resumes, exactly.

Both hold the full weights in ``model.safetensors`` and the optimizer state in ``torch.save`` files: a ddp run's
whole state in ``optimizer.pt``, or every rank's FSDP1 flat shard in ``optimizer_rank_NNNNN.pt`` (format 1 kept no
sizes and checksums in meta.json, ``meta.expected_files`` lists its names). The torch 2.5.1 checkpoints in
tests/data/torch251 are of format 2. `read` reads them on each rank (no collective) into `FullState`, which
`store.apply` loads as it loads a DCP checkpoint's state: into this run's model and optimizer, whatever its wrapper
and world size, through ``set_state_dict(full_state_dict=True)`` (each rank keeps its shard). They hold no model
EMA and always an optimizer state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

from vitlarge.checkpoint import sharded
from vitlarge.checkpoint.state import RunState
from vitlarge.checkpoint.trust.layout import Unusable
from vitlarge.checkpoint.trust.torch_files import optimizer_state_problem, safetensors_file, torch_load
from vitlarge.distributed.plugins import unwrap
from vitlarge.errors import UserError

MODEL = "model.safetensors"
FULL_OPTIMIZER = "optimizer.pt"
SHARDED_OPTIMIZER = "optimizer_rank_{rank:05d}.pt"


def optimizer_sources(files: dict) -> list[str]:
    """The optimizer files of a format-1/2 checkpoint listing ``files``: ddp's whole one, or every rank's shard."""
    if FULL_OPTIMIZER in files:
        return [FULL_OPTIMIZER]
    return sorted(n for n in files if n.startswith("optimizer_rank_"))


def files_read(files: dict) -> list[str]:
    """The files a resume reads on every rank (besides its rank file): the weights and the optimizer files."""
    return [MODEL, *optimizer_sources(files)]


@dataclass(frozen=True)
class FullState:
    """A format-1/2 checkpoint's whole model and optimizer state, read on this rank."""

    model: dict[str, torch.Tensor]
    optimizers: list[dict]
    """``optimizer.pt``'s state, or every rank's FSDP1 shard in rank order."""
    from_ddp: bool

    def load_into(self, path: Path, state: RunState) -> None:
        """A collective under fsdp: loads the full tensors into ``state``'s model and optimizer (bit copies)."""
        model, opt = state.model, getattr(state.optimizer, "optim", state.optimizer)
        names = sharded.param_names(model, opt)
        shapes = sharded.full_shapes(model)
        whole = (
            self.optimizers[0]
            if self.from_ddp
            else full_optimizer_state(path, self.optimizers, [shapes[n] for n in names])
        )
        problem = optimizer_state_problem(whole, len(names))  # indices within this model's parameters
        if problem:
            raise Unusable(path, f"its optimizer state {problem}")
        problem = sharded.param_groups_problem(sharded.group_settings(opt.param_groups), whole["param_groups"])
        if problem:
            raise Unusable(path, f"its optimizer state holds settings this run's optimizer does not write ({problem})")
        by_name = {
            "state": {names[i]: s for i, s in whole["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in whole["param_groups"]],
        }
        set_state_dict(
            unwrap(model),
            opt,
            model_state_dict=cast("dict[str, Any]", self.model),  # DCP's ValueType dict is invariant
            optim_state_dict=by_name,
            options=StateDictOptions(full_state_dict=True),
        )


def read(path: Path, files: dict) -> FullState:
    """Rank-local: the weights and optimizer files of format-1/2 checkpoint ``path`` (``files``: its listing).
    Raises `Unusable` where an optimizer file is not an optimizer state dict of the form torch writes."""
    optimizer_files = optimizer_sources(files)
    optimizers = [torch_load(path, n) for n in optimizer_files]
    for name, state in zip(optimizer_files, optimizers):
        problem = optimizer_state_problem(state)
        if problem:
            raise Unusable(path, f"{name} {problem}")
    return FullState(
        model=safetensors_file(path, MODEL), optimizers=optimizers, from_ddp=optimizer_files == [FULL_OPTIMIZER]
    )


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
