"""A run's checkpoints, as the training code sees them: one `Checkpointer` over the workdir and the run's parts.

As torchtitan's ``CheckpointManager``: the run hands over its stateful parts once (`Checkpointer.attach`: the model
with its optimizer, the loss scaler, the model EMA; the RNGs are this process's own) and then only asks to
resume, save and prune; what a checkpoint holds of each part and where is `vitlarge.checkpoint.state.RunState`'s
(one entry per part), how it is written and read is vitlarge/checkpoint/store.py's, which checkpoint a run
continues from is vitlarge/checkpoint/resume.py's, and every check of a file from elsewhere is
vitlarge/checkpoint/trust/'s. vitlarge/run/ and vitlarge/train/ use this class and nothing else of
vitlarge/checkpoint/ but the export (vitlarge/checkpoint/export.py) and ``model.init_from``
(vitlarge/checkpoint/init_from.py), which are not checkpoints of this run.

Collectives are marked as such: every rank calls them together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlarge.checkpoint import resume, store
from vitlarge.checkpoint.state import LoadedCheckpoint, RunState
from vitlarge.checkpoint.trust.layout import CHECKPOINTS_DIR, exists, list_checkpoints, read_meta
from vitlarge.checkpoint.workdir import SHARED_PROBE, check_shared_probe, check_writable, write_shared_probe
from vitlarge.config.schema import Config


class Checkpointer:
    """The checkpoints of the run in ``workdir`` under ``cfg``: the workdir's checks before any work, the choice
    and restore of a resume, the save (which prunes to ``train.keep_checkpoints``)."""

    def __init__(self, workdir: str | Path, cfg: Config):
        self.workdir, self.cfg = Path(workdir), cfg
        self._parts: dict[str, Any] | None = None

    @property
    def folder(self) -> Path:
        """``<workdir>/checkpoints``: one ``step_NNNNNNN`` folder per checkpoint."""
        return self.workdir / CHECKPOINTS_DIR

    def attach(self, model, optimizer, scaler, ema=None) -> Checkpointer:
        """The run's stateful parts that a checkpoint saves and a resume fills (see `RunState`). Returns self."""
        self._parts = {"model": model, "optimizer": optimizer, "scaler": scaler, "ema": ema}
        return self

    def state(
        self,
        step: int = 0,
        data: str | None = None,
        lineage: str | None = None,
        config: dict | None = None,
        schedule: dict | None = None,
    ) -> RunState:
        """The run's state on this rank: the attached parts, this process's RNGs and the values a checkpoint records
        beside them (``step``, the loader position ``data``, the ``lineage``, the resolved ``config`` record, the
        plan's ``schedule`` record)."""
        assert self._parts is not None, "attach the run's parts first"
        return RunState(**self._parts, step=step, data=data, lineage=lineage, config=config, schedule=schedule)

    # The workdir, before any work.

    def any(self) -> bool:
        """Whether the workdir holds a published checkpoint (checked or not)."""
        return bool(list_checkpoints(self.workdir))

    def check_writable(self, rank: int) -> None:
        """Raises a one-line `UserError` when this rank cannot write the workdir."""
        check_writable(self.workdir, rank)

    def write_shared_probe(self) -> str:
        """Rank 0: a probe file in the workdir; returns the token every rank must read back from it."""
        return write_shared_probe(self.workdir)

    def check_shared_probe(self, token: str) -> None:
        """Every rank: raises a one-line `UserError` when the probe does not hold ``token`` (another workdir)."""
        check_shared_probe(self.workdir, token)

    def remove_shared_probe(self) -> None:
        """Rank 0, once every rank has read the probe."""
        (self.workdir / SHARED_PROBE).unlink(missing_ok=True)

    # Resume.

    def check_requested(self, requested: str | Path) -> None:
        """Raises a one-line `UserError` when ``--resume requested`` can neither be read nor continued here."""
        resume.check_requested(self.workdir, requested)

    def choose(self, requested: str | Path | None, model, num_train_examples: int | None) -> resume.Choice:
        """Collective: the checkpoint every rank resumes from and the lineage of this run's checkpoints."""
        return resume.choose(self.workdir, requested, model, self.cfg, num_train_examples)

    def lineage_of(self, path: str | Path) -> str | None:
        """The lineage checkpoint ``path`` belongs to (its meta.json's ``line``)."""
        return read_meta(path).get("line")

    def restore(self, path: Path) -> LoadedCheckpoint:
        """Collective: every rank loads ``path`` into the attached parts; returns what it restored."""
        return resume.restore(path, self.state(), self.cfg)

    # Save.

    def has(self, step: int) -> bool:
        """Whether the workdir holds a published checkpoint of ``step``."""
        return exists(self.workdir, step)

    def save(self, state: RunState) -> Path:
        """Collective: publishes a checkpoint of ``state`` (`state`) and prunes the older ones to
        ``train.keep_checkpoints``; returns its path."""
        return store.save(self.workdir, state, self.cfg, keep=self.cfg.train.keep_checkpoints)

    def prune(self, keep: int, step: int) -> None:
        """Rank 0: the oldest checkpoints older than ``step`` removed, so that ``keep`` remain counting it."""
        store.prune(self.workdir, keep, step)
