"""A run's checkpoints, as the training code sees them: one `Checkpointer` over the workdir and the run's parts.

As torchtitan's ``CheckpointManager``: the run makes it once over its workdir (`Checkpointer.check_workdir`: every
check of the workdir before any work), hands over its stateful parts once (`Checkpointer.attach`: the model with its
optimizer, the loss scaler, the model EMA; the RNGs are this process's own) and then only asks to resume, save and
prune; what a checkpoint holds of each part and where is `vitlarge.checkpoint.state.RunState`'s
(one entry per part), how it is written and read is vitlarge/checkpoint/store.py's, which checkpoint a run
continues from is vitlarge/checkpoint/resume.py's, and every check of a file from elsewhere is
vitlarge/checkpoint/trust/'s. vitlarge/run/ and vitlarge/train/ use this class and nothing else of
vitlarge/checkpoint/ but the export (vitlarge/checkpoint/export.py) and ``model.init_from``
(vitlarge/checkpoint/init_from.py), which are not checkpoints of this run.

Collectives are marked as such: every rank calls them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from vitlarge.checkpoint import resume as _resume
from vitlarge.checkpoint import store
from vitlarge.checkpoint.state import LoadedCheckpoint, RunState
from vitlarge.checkpoint.trust.layout import CHECKPOINTS_DIR, exists, list_checkpoints
from vitlarge.checkpoint.workdir import SHARED_PROBE, check_shared_probe, check_writable, write_shared_probe
from vitlarge.config.schema import Config
from vitlarge.distributed.collective import agree, rank0_decides


@dataclass(frozen=True)
class Resumed:
    """What `Checkpointer.resume` found: the checkpoint every rank loaded (None: the run starts from scratch)."""

    path: Path | None
    lineage: str | None
    """The lineage this run's checkpoints belong to (their meta.json's ``line``)."""
    parent_lineage: str | None
    """The lineage the loaded checkpoint came from (its own meta.json's ``line``, read in rank 0's choice)."""
    loaded: LoadedCheckpoint | None
    """What was restored into the attached parts (None without a checkpoint)."""


class Checkpointer:
    """The checkpoints of the run in ``workdir`` under ``cfg`` on ``rank``: the workdir's checks before any work,
    the resume, the save (which prunes to ``train.keep_checkpoints``)."""

    def __init__(self, workdir: str | Path, cfg: Config, rank: int = 0, classes: list[str] | None = None):
        self.workdir, self.cfg, self.rank = Path(workdir), cfg, rank
        self.classes = classes  # the data set's class names, recorded in each meta.json (`RunState.classes`)
        self._parts: dict[str, Any] | None = None

    @property
    def folder(self) -> Path:
        """``<workdir>/checkpoints``: one ``step_NNNNNNN`` folder per checkpoint."""
        return self.workdir / CHECKPOINTS_DIR

    def any(self) -> bool:
        """Whether the workdir holds a published checkpoint folder (checked or not; a ``step_*`` link is none: a
        fresh fine-tuning workdir holding one still starts from ``model.init_from``)."""
        return bool(list_checkpoints(self.workdir, links=False))

    def check_workdir(self, requested: str | Path | None = None) -> None:
        """Collective, before any work: the workdir is writable on every rank (its checkpoints folder no link
        elsewhere), every rank sees the folder rank 0 writes to (a probe file rank 0 writes and every rank reads
        back), and a ``--resume requested`` can be read or continued here (rank 0's view). Each raises one line on
        every rank (`vitlarge.checkpoint.workdir`, `vitlarge.checkpoint.resume.check_requested`)."""
        agree(partial(check_writable, self.workdir, self.rank))
        token = rank0_decides(partial(write_shared_probe, self.workdir))  # the same workdir, not a local stand-in
        agree(partial(check_shared_probe, self.workdir, token))
        if self.rank == 0:  # every rank has read it (agree is a collective)
            (self.workdir / SHARED_PROBE).unlink(missing_ok=True)
        if requested:  # a missing --resume path fails before any work, unless its lineage continues here
            rank0_decides(partial(_resume.check_requested, self.workdir, requested))

    def attach(self, model, optimizer, scaler, ema=None) -> Checkpointer:
        """The run's stateful parts that a checkpoint saves and a resume fills (see `RunState`). Returns self."""
        self._parts = {"model": model, "optimizer": optimizer, "scaler": scaler, "ema": ema}
        return self

    def resume(self, requested: str | Path | None, num_train_examples: int | None) -> Resumed:
        """Collective: rank 0 chooses the checkpoint every rank resumes from (``--resume requested``, else the
        workdir's newest that passes its check: `vitlarge.checkpoint.resume`), and every rank loads it into the
        attached parts."""
        state = self._state()
        choice = _resume.choose(
            self.workdir, requested, state.model, self.cfg, num_train_examples, optimizer=state.optimizer
        )
        if choice.path is None:
            return Resumed(None, choice.lineage, None, None)
        return Resumed(choice.path, choice.lineage, choice.parent, _resume.restore(choice.path, state, self.cfg))

    def has(self, step: int) -> bool:
        """Whether the workdir holds a published checkpoint of ``step``."""
        return exists(self.workdir, step)

    def save(
        self,
        step: int,
        data: str | None = None,
        lineage: str | None = None,
        config: dict | None = None,
        schedule: dict | None = None,
    ) -> Path:
        """Collective: publishes a checkpoint of the attached parts and this process's RNGs at ``step``, with the
        values a checkpoint records beside them (the loader position ``data``, the ``lineage``, the resolved
        ``config`` record, the plan's ``schedule`` record), and prunes the older ones to ``train.keep_checkpoints``;
        returns its path."""
        state = self._state(step, data, lineage, config, schedule)
        return store.save(self.workdir, state, self.cfg, keep=self.cfg.train.keep_checkpoints)

    def prune(self, keep: int, step: int) -> None:
        """Rank 0: the oldest checkpoints older than ``step`` removed, so that ``keep`` remain counting it."""
        store.prune(self.workdir, keep, step)

    def _state(
        self,
        step: int = 0,
        data: str | None = None,
        lineage: str | None = None,
        config: dict | None = None,
        schedule: dict | None = None,
    ) -> RunState:
        assert self._parts is not None, "attach the run's parts first"
        return RunState(
            **self._parts, step=step, data=data, lineage=lineage, config=config, schedule=schedule, classes=self.classes
        )
