"""Each phase's loaders, built at its first step, and the data state a checkpoint keeps for them.

Every run goes through `PhasedLoaders` (a recipe without ``train.phases`` is one phase); it hands
each phase's loaders the phase (`vitlarge.data.sources`). A checkpoint's data state is a `DataState`,
``{"version", "phase", "phases": fingerprint, "loader": the loader's own state}`` in JSON: a resume
in the same phase under the same phase list continues the stream exactly.
Checkpoints of runs without phases written before every run had phases hold the loader's own state
alone; it is read as phase 0's under the empty phase list, which is what it was.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
import sys
from dataclasses import dataclass
from typing import Any

from vitlarge.config.schema import Config
from vitlarge.data import sources
from vitlarge.data.common import STATE_VERSION, SettingsChanged
from vitlarge.plan.phases import Phase
from vitlarge.plan.plan import Plan

log = logging.getLogger("vitlarge")


def fingerprint(cfg: Config, plan: Plan) -> str:
    """A short hash of ``cfg``'s phase list as ``plan`` resolved it (its phases' resolved entries: world-size independent): a
    checkpoint's data state is tied to it, so a resume after an edit of ``train.phases`` does not continue another
    phase's stream."""
    # A recipe without train.phases hashes the empty list, as the state of its one phase always has.
    listed = [_hashed(ph.entry) for ph in plan.phases] if cfg.train.phases else []
    doc = json.dumps(listed, sort_keys=True, default=list)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def _hashed(spec) -> dict:
    """A phase's fields the fingerprint holds: all but those marked ``fingerprint=False`` (validation only)."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.metadata.get("fingerprint", True)}


NO_PHASES = hashlib.sha256(b"[]").hexdigest()[:16]  # the fingerprint of a recipe without train.phases


@dataclass(frozen=True)
class DataState:
    """A checkpoint's data state: the ``phase`` it belongs to, the ``phases`` fingerprint of the phase list it was
    written under, the ``loader``'s own state (opaque here) and, for a stream started afresh mid-phase, the step
    ``fresh_at`` it started at. `to_json` writes the bytes every vitlarge with phases has written."""

    phase: int
    phases: str | None
    loader: str
    fresh_at: int | None = None

    def to_dict(self) -> dict:
        doc = {"version": STATE_VERSION, "phase": self.phase, "phases": self.phases, "loader": self.loader}
        if self.fresh_at is not None:
            doc["fresh_at"] = self.fresh_at
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, doc: dict, text: str) -> DataState:
        """From the parsed ``doc`` of ``text``; ValueError if malformed. A loader's own state (no ``phase``:
        written by a run without phases before they all had one) is phase 0's under the empty phase list."""
        if "phase" not in doc:
            return cls(0, NO_PHASES, text)
        # A rank file from elsewhere: each value of the type vitlarge writes (1e999 is no phase; True is no step)
        phase, phases, loader, fresh_at = doc["phase"], doc.get("phases"), doc.get("loader"), doc.get("fresh_at")
        if type(phase) is not int or phase < 0:
            raise ValueError(f"phase {str(phase)[:40]} is not a phase index")
        if not isinstance(phases, (str, type(None))) or not isinstance(loader, str):
            raise ValueError("phases or loader is not a string")
        if fresh_at is not None and type(fresh_at) is not int:
            raise ValueError(f"fresh_at {str(fresh_at)[:40]} is not a step")
        return cls(phase, phases, loader, fresh_at)

    @classmethod
    def from_json(cls, text: str) -> DataState:
        """The state ``text`` holds; ValueError if it is not one."""
        try:
            doc = json.loads(text)
        except (ValueError, TypeError, RecursionError) as e:
            raise ValueError(str(e)) from None
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        return cls.from_dict(doc, text)

    @classmethod
    def read(cls, text: str | None) -> DataState | None:
        """The state ``text`` holds; None for none or a malformed one (its loader starts afresh)."""
        if not text:
            return None
        try:
            return cls.from_json(text)
        except ValueError:
            return None


def state_of_other_phases(state: str | None, cfg: Config, plan: Plan) -> bool:
    """Whether a checkpoint's data state was written under another phase list than ``cfg``'s (``plan``: this run's;
    one with phases and one without count as different): the run then drops it with one warning and each
    phase's stream starts afresh."""
    if not state:
        return False
    try:
        return DataState.from_json(state).phases != fingerprint(cfg, plan)
    except ValueError:
        return True


@dataclass
class _PhaseTrain:
    """A phase's TrainLoader whose ``state()`` also records the phase it belongs to, the phase list and, for a
    stream started afresh mid-phase, the step it started at (its seed derives from it: a later resume
    rebuilds the same stream and continues it)."""

    loader: Any
    phase: int
    phases_hash: str
    fresh_at: int | None = None

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.loader)

    def state(self) -> str:
        return DataState(self.phase, self.phases_hash, self.loader.state(), self.fresh_at).to_json()


class PhasedLoaders:
    """The train and validation loaders of the phase a step belongs to, rebuilt at boundaries.

    ``enter(step)`` returns ``(train, val)`` when ``step`` starts a phase other than the current one
    (the first call always does), else None. A checkpoint's state from the same phase continues that
    phase's stream; from an earlier phase it is dropped: the new phase starts its stream afresh, as
    an uninterrupted run does at the boundary.
    """

    def __init__(self, cfg: Config, plan: Plan, rank: int, world_size: int, device, state: str | None = None):
        self.cfg, self.plan, self.rank, self.world_size, self.device = cfg, plan, rank, world_size, device
        self.current: Phase | None = None
        self._saved = DataState.read(state)  # used once, by the phase it belongs to
        self._phases_hash = fingerprint(cfg, plan)

    def changes_at(self, step: int) -> bool:
        """Whether ``enter(step)`` builds new loaders (the caller drops the old ones first)."""
        return self.current is None or self.plan.phase_at(step).index != self.current.index

    def enter(self, step: int):
        ph = self.plan.phase_at(step)
        if not self.changes_at(step):
            return None
        saved = self._saved if self._saved is not None and self._saved.phase == ph.index else None
        self._saved = None
        state = saved.loader if saved is not None else None
        # A position continues the stream it was saved from: one started afresh mid-phase keeps its seed.
        fresh_at = saved.fresh_at if saved is not None else None
        self.current = ph
        # Entered after its first step with no position to continue (a resume whose data state was
        # dropped): a fresh epoch order from this step, not a replay of the phase's beginning.
        if state is None and step != ph.start_step:
            fresh_at = step
        try:
            loader = sources.train_loader(
                self.cfg, self.rank, self.world_size, self.device, state, phase=ph, fresh_at=fresh_at
            )
        except SettingsChanged:  # an edited micro batch, crop, RandAugment or shard set: the position is void
            if self.rank == 0:
                log.warning(
                    f"warning: the data or loader settings changed since the checkpoint (batch size, image size, "
                    f"augmentation or shards); the data stream continues at step {step} with a fresh epoch order, "
                    "weights, optimizer and step resume exactly"
                )
            fresh_at = step
            loader = sources.train_loader(self.cfg, self.rank, self.world_size, self.device, phase=ph, fresh_at=step)
        val = sources.val_loader(self.cfg, self.rank, self.world_size, self.device, phase=ph)
        return _PhaseTrain(loader, ph.index, self._phases_hash, fresh_at), val


def evaluated_phase(plan: Plan, step: int | None) -> Phase:
    """The phase whose validation the trainer runs after ``step`` optimizer steps (that of the step just
    taken: an evaluation at a boundary still belongs to the phase that ends there); the last phase for
    ``None`` (an exported model: the size its config.json declares)."""
    if step is None:
        return plan.phases[-1]
    return plan.phase_at(max(0, step - 1))


def release_loader_memory(device) -> None:
    """After the old phase's loaders are dropped: collect their pipelines and, on a GPU, hand DALI's
    freed pool blocks back (``nvidia.dali.backend.ReleaseUnusedMemory``, where this DALI has it), so the
    new phase's pipelines do not stack on the old ones' memory. The GPU branch is not run by the tests.
    A process that never loaded DALI (``data.source=synthetic``) has no DALI pool, and may have no DALI."""
    gc.collect()
    backend = sys.modules.get("nvidia.dali.backend")
    if getattr(device, "type", str(device)) == "cuda" and backend is not None:
        release = getattr(backend, "ReleaseUnusedMemory", None)
        if release is not None:
            release()
