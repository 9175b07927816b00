"""Each phase's loaders, built at its first step, and the data state a checkpoint keeps for them.

Every run goes through `PhasedLoaders` (a recipe without ``train.phases`` is one phase). A
checkpoint's data state is ``{"version", "phase", "phases": fingerprint, "loader": the loader's
own state}``: a resume in the same phase under the same phase list continues the stream exactly.
Checkpoints of runs without phases written before every run had phases hold the loader's own state
alone; it is read as phase 0's under the empty phase list, which is what it was.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging

from vitlarge.config.phase_list import resolve_phases
from vitlarge.config.schema import Config
from vitlarge.data.common import SettingsChanged
from vitlarge.plan.phases import Phase, phase_config
from vitlarge.plan.plan import Plan

log = logging.getLogger("vitlarge")


def fingerprint(cfg: Config) -> str:
    """A short hash of the resolved phase list (world-size independent): a checkpoint's data state is
    tied to it, so a resume after an edit of ``train.phases`` does not continue another phase's stream."""
    # A recipe without train.phases hashes the empty list, as the state of its one phase always has.
    listed = [dataclasses.asdict(p) for p in resolve_phases(cfg)] if cfg.train.phases else []
    doc = json.dumps(listed, sort_keys=True, default=list)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def _parts(state: str) -> tuple[int, str, str]:
    """(phase, phase-list fingerprint, loader state) of a checkpoint's data state; ValueError if malformed."""
    return _fields_of(state)[:3]


def _fields_of(state: str) -> tuple[int, str, str, int | None]:
    """`_parts` and the step the stream started afresh at (None: at its phase's start)."""
    try:
        doc = json.loads(state)
    except (ValueError, TypeError, RecursionError) as e:
        raise ValueError(str(e)) from None
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    if "phase" not in doc:  # a loader's own state: written by a run without phases before they all had one
        return 0, NO_PHASES, state, None
    try:
        fresh_at = doc.get("fresh_at")
        return int(doc["phase"]), doc.get("phases"), doc["loader"], None if fresh_at is None else int(fresh_at)
    except (KeyError, TypeError) as e:
        raise ValueError(str(e)) from None


NO_PHASES = hashlib.sha256(b"[]").hexdigest()[:16]  # the fingerprint of a recipe without train.phases


def state_of_other_phases(state: str | None, cfg: Config) -> bool:
    """Whether a checkpoint's data state was written under another phase list than ``cfg``'s (one with
    phases and one without count as different): the run then drops it with one warning and each
    phase's stream starts afresh."""
    if not state:
        return False
    try:
        return _parts(state)[1] != fingerprint(cfg)
    except ValueError:
        return True


class _PhaseTrain:
    """A phase's TrainLoader whose ``state()`` also records the phase it belongs to, the phase list and, for a
    stream started afresh mid-phase, the step it started at (its seed derives from it: a later resume
    rebuilds the same stream and continues it)."""

    def __init__(self, loader, phase: int, phases_hash: str, fresh_at: int | None = None):
        self.loader, self.phase, self.phases_hash, self.fresh_at = loader, phase, phases_hash, fresh_at

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.loader)

    def state(self) -> str:
        from vitlarge.data.common import STATE_VERSION

        doc = {"version": STATE_VERSION, "phase": self.phase, "phases": self.phases_hash, "loader": self.loader.state()}
        if self.fresh_at is not None:
            doc["fresh_at"] = self.fresh_at
        return json.dumps(doc)


def split_state(state: str | None) -> tuple[int | None, str | None, int | None]:
    """(phase, loader state, fresh_at) of a checkpoint's data state; Nones for none or a malformed one."""
    if not state:
        return None, None, None
    try:
        phase, _, loader, fresh_at = _fields_of(state)
    except ValueError:
        return None, None, None
    return phase, loader, fresh_at


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
        self._state_phase, self._state, self._state_fresh_at = split_state(state)

    def changes_at(self, step: int) -> bool:
        """Whether ``enter(step)`` builds new loaders (the caller drops the old ones first)."""
        return self.current is None or self.plan.phase_at(step).index != self.current.index

    def enter(self, step: int):
        from vitlarge.data.sources import train_loader, val_loader

        ph = self.plan.phase_at(step)
        if not self.changes_at(step):
            return None
        state = self._state if self._state_phase == ph.index else None
        # A position continues the stream it was saved from: one started afresh mid-phase keeps its seed.
        fresh_at = self._state_fresh_at if state is not None else None
        self._state_phase = self._state = self._state_fresh_at = None  # used once, by the phase it belongs to
        self.current = ph
        # Entered after its first step with no position to continue (a resume whose data state was
        # dropped): a fresh epoch order from this step, not a replay of the phase's beginning.
        if state is None and step != ph.start_step:
            fresh_at = step
        try:
            loader = train_loader(phase_config(self.cfg, ph, fresh_at), self.rank, self.world_size, self.device, state)
        except SettingsChanged:  # an edited micro batch, crop, RandAugment or shard set: the position is void
            if self.rank == 0:
                log.warning(
                    f"warning: the data or loader settings changed since the checkpoint (batch size, image size, "
                    f"augmentation or shards); the data stream continues at step {step} with a fresh epoch order, "
                    "weights, optimizer and step resume exactly"
                )
            fresh_at = step
            loader = train_loader(phase_config(self.cfg, ph, step), self.rank, self.world_size, self.device)
        train = _PhaseTrain(loader, ph.index, fingerprint(self.cfg), fresh_at)
        return train, val_loader(val_config(self.cfg, ph), self.rank, self.world_size, self.device)


def val_config(cfg: Config, ph: Phase) -> Config:
    """What phase ``ph``'s validation loader is built from: its batches and crop, at its ``eval_size``.
    The trainer's evaluation and ``python -m vitlarge.evaluate`` both use it, so they agree to the image."""
    vc = phase_config(cfg, ph)
    vc.data.image_size = ph.eval_size
    return vc


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
    import gc
    import sys

    gc.collect()
    backend = sys.modules.get("nvidia.dali.backend")
    if getattr(device, "type", str(device)) == "cuda" and backend is not None:
        release = getattr(backend, "ReleaseUnusedMemory", None)
        if release is not None:
            release()
