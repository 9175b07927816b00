"""What a checkpoint holds of a run, as parts that each offer their state and take it back.

Every stateful part speaks one protocol, `Stateful` (``state_dict()`` / ``load_state_dict()``, the shape of
``torch.distributed.checkpoint.stateful.Stateful`` and torchtitan's checkpointer): the loss scaler (torch's
``GradScaler``), the model EMA (`vitlarge.model.ema.ModelEma`), this process's RNGs (`RngState`), and the weights
and optimizer state through DCP's state-dict API (`vitlarge.checkpoint.sharded.Weights` and ``OptimizerState``),
which shard and re-shard them. `RunState` gathers the parts, with the three values that travel beside them: the step, this
rank's loader position and the run's lineage (meta.json's ``line``, see vitlarge/checkpoint/resume.py).
`vitlarge.checkpoint.store.save` takes a `RunState`; ``store.load`` fills one and returns a `LoadedCheckpoint`.

Where each part lands on disk (format 3, unchanged) is `RunState`'s two maps of parts, by the key each is stored
under: ``sharded_parts`` (model, optimizer and EMA in DCP's ``.distcp`` files) and ``rank_parts`` (RNG and scaler in
``rank_NNNNN.pt``, beside the loader position ``data``); step and lineage in meta.json. Adding a part is one entry
in one of them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import numpy as np
import torch
from torch import nn

from vitlarge.checkpoint.sharded import OptimizerState, Weights
from vitlarge.data.common import older_state_version
from vitlarge.data.phased import state_of_other_phases
from vitlarge.model.ema import ModelEma
from vitlarge.text import plural

if TYPE_CHECKING:
    from vitlarge.config.schema import Config
    from vitlarge.plan.plan import Plan


@runtime_checkable
class Stateful(Protocol):
    """A part of a run that a checkpoint saves and restores (torch's ``Stateful`` protocol)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class RngState:
    """This process's torch (CPU and, once initialised, CUDA), numpy and Python RNGs as a `Stateful`."""

    def state_dict(self) -> dict[str, Any]:
        np_state = cast(tuple, np.random.get_state())  # the legacy form: (name, keys, pos, has_gauss, cached)
        state = {
            "torch": torch.get_rng_state(),
            "numpy": {
                "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                "pos": int(np_state[2]),
                "has_gauss": int(np_state[3]),
                "cached_gaussian": float(np_state[4]),
            },
            "python": random.getstate()[1],
            "python_gauss": random.getstate()[2],  # random.gauss() caches its second value
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        n = state_dict["numpy"]
        np.random.set_state(
            ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
        )
        random.setstate((3, tuple(state_dict["python"]), state_dict.get("python_gauss")))
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state(state_dict["cuda"])


@dataclass
class RunState:
    """A run's state on this rank, as a checkpoint saves it and a resume fills it.

    ``optimizer``: a torch optimizer or Colossal-AI's wrapper of one. ``step``, ``data`` and ``lineage`` are values
    a save records; a resume returns them in `LoadedCheckpoint` (the loaders are built from the position then)."""

    model: nn.Module
    optimizer: Any
    scaler: torch.amp.GradScaler
    ema: ModelEma | None = None
    rng: Stateful = field(default_factory=RngState)
    step: int = 0
    data: str | None = None
    """This rank's loader position (``rank_NNNNN.pt``'s ``data``), or None."""
    lineage: str | None = None
    """The lineage this run's checkpoints belong to (meta.json's ``line``)."""
    config: dict[str, Any] | None = None
    """The config as the run's records show it, device-dependent values resolved (meta.json's ``config``;
    `vitlarge.events.RunInfo.record`); None: the config `store.save` is given, as written."""
    schedule: dict[str, Any] | None = None
    """What the run's plan records beside the config (meta.json's ``schedule``, `vitlarge.plan.plan.Plan.record`);
    None: not written."""
    classes: list[str] | None = None
    """The data set's class names in label order (meta.json's ``classes``: what ``vitlarge.evaluate`` maps a data set
    by, `vitlarge.data.class_map`); None: not written."""

    def sharded_parts(self, with_optimizer: bool = True, with_ema: bool = True) -> dict[str, Stateful]:
        """The parts DCP saves and loads (``.distcp``), by the key each is stored under: the weights, the
        optimizer state (``with_optimizer``: it has stepped, or the checkpoint holds it) and the EMA average
        (``with_ema``, when the run has one). A new sharded part is one entry here."""
        parts: dict[str, Stateful] = {"model": Weights(self.model)}
        if with_optimizer:
            parts["optimizer"] = OptimizerState(self.model, self.optimizer)
        if with_ema and self.ema is not None:
            parts["ema"] = self.ema
        return parts

    def rank_parts(self) -> dict[str, Stateful]:
        """The rank-local parts (``rank_NNNNN.pt``), by the key each is stored under. A new one is one entry here."""
        return {"rng": self.rng, "scaler": cast(Stateful, self.scaler)}

    def rank_state(self) -> dict[str, Any]:
        """What ``rank_NNNNN.pt`` holds: the rank-local parts' states and the loader position."""
        return {**{name: part.state_dict() for name, part in self.rank_parts().items()}, "data": self.data}


@dataclass(frozen=True)
class DataPosition:
    """The loader position a resumed run continues (None: a fresh epoch order), and the one warning line that says
    why it was dropped (None when it was not)."""

    state: str | None
    warning: str | None = None


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What a resume restored from a checkpoint, and the rules for what of it this run can use."""

    path: Path
    step: int
    world_size: int
    """The number of processes that wrote the checkpoint."""
    data_state: str | None
    """This rank's loader position as saved; None when it was written by another world size."""
    lineage: str | None = None
    """The lineage the checkpoint belongs to (its meta.json's ``line``)."""
    config: dict = field(default_factory=dict)
    """The config the checkpoint recorded (meta.json's ``config``)."""
    schedule: dict = field(default_factory=dict)
    """What its plan recorded beside the config (meta.json's ``schedule``; empty for an older checkpoint)."""

    def usable_data_state(self, cfg: Config, plan: Plan, schedule_exact: bool = True) -> DataPosition:
        """The loader position this run continues, and the line that says what was dropped and why. Weights,
        optimizer and step always resume exactly, and the lr schedule where ``schedule_exact`` (else the lines of
        `vitlarge.plan.edits.resume_plan` say what changed); the data stream restarts with a fresh epoch
        order when the position was written by another world size, by an older vitlarge (another pipeline), or
        under another ``train.phases`` list."""
        if self.world_size != plan.world_size:
            ph = plan.phase_at(self.step)
            micro = f"{plural(ph.accum_steps, 'micro-step')} per step now"
            kept = (
                f"weights, optimizer (re-sharded), step and lr schedule resume exactly, the global batch stays "
                f"{ph.global_batch} ({micro})"
                if schedule_exact
                else f"weights, optimizer (re-sharded) and step resume ({micro}), the schedule as the lines below say"
            )
            return DataPosition(
                None,
                f"warning: {self.path} was written by {plural(self.world_size, 'process')}, this run has "
                f"{plan.world_size}: {kept}, the data stream restarts with a fresh epoch order",
            )
        old = older_state_version(self.data_state)
        if old is not None:
            return DataPosition(
                None,
                f"warning: {self.path} holds a data-loader position from an older vitlarge (state version {old}); "
                "the data stream restarts with a fresh epoch order, weights, optimizer and step resume exactly",
            )
        if state_of_other_phases(self.data_state, cfg, plan):
            return DataPosition(
                None,
                f"warning: {self.path} was written under another train.phases list (or none); the data stream "
                "restarts with a fresh epoch order, weights, optimizer and step resume; "
                + (
                    "lr and phase follow the new list at that step"
                    if schedule_exact
                    else "the phase follows the new list at that step, the lr as the lines below say"
                ),
            )
        return DataPosition(self.data_state)
