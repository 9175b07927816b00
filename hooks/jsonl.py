"""Machine-readable run log: ``<workdir>/metrics.jsonl``, one JSON object per line and event.

Main rank only. Contract (keys and units are listed in docs/LOGS.md):

* every record has ``event`` (``start``, ``train``, ``eval``, ``checkpoint``, ``end``), ``step``
  and ``time`` (Unix seconds); ``start.step`` is the step the run (re)started from;
* one ``train`` record per optimizer step;
* non-finite floats (nan, inf) are written as ``null``, so every line is strict JSON;
* the file is opened in append mode with line buffering: a killed run leaves whole lines, and a
  resumed run appends after them. A resumed run repeats the steps after its checkpoint, so read
  the file with `read_metrics`, which keeps one record per step;
* a symbolic link, FIFO or device planted under the name (a handed-over workdir) stops the run
  with one line; nothing is written through it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from vitlarge.errors import UserError
from vitlarge.events import EvalMetrics, Hook, RunInfo, StepMetrics, finite_or_none
from vitlarge.fileio import UnsafeFile, open_append
from vitlarge.report.metrics_log import FILENAME, read_metrics  # noqa: F401 (read_metrics re-exported)


class JsonlHook(Hook):
    """Appends one line per event to ``<workdir>/metrics.jsonl``."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, FILENAME)
        self._file = None

    def on_train_start(self, run: RunInfo) -> None:
        if not run.is_main:
            return
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        try:
            self._file = open_append(self.path)
        except UnsafeFile as e:
            raise UserError(
                f"{self.path}: {e.strerror}; remove it (or put a copy of the file it stands for in its place) "
                "and run again"
            ) from None
        # A run killed mid-write (or a full disk) may have left a partial last line; start on a
        # fresh line so our first record stays parseable.
        size = os.fstat(self._file.fileno()).st_size
        if size and os.pread(self._file.fileno(), 1, size - 1) != b"\n":
            self._file.write("\n")
        p = run.plan
        ph = p.phase_at(run.start_step)  # the phase this run starts (or resumes) in
        self._write(
            {
                "event": "start",
                "step": run.start_step,
                "world_size": p.world_size,
                "global_batch": ph.global_batch,
                "micro_batch": ph.micro_batch,
                "accum_steps": ph.accum_steps,
                "steps_per_epoch": ph.steps_per_epoch,
                "total_steps": p.total_steps,
                "warmup_steps": p.warmup_steps,
                "config": run.record,
            }
        )

    def on_step_end(self, run: RunInfo, m: StepMetrics) -> None:
        self._write({"event": "train", **m.record()})

    def on_eval_end(self, run: RunInfo, m: EvalMetrics) -> None:
        self._write({"event": "eval", **m.record()})

    def on_checkpoint(self, run: RunInfo, step: int, path: str) -> None:
        self._write({"event": "checkpoint", "step": step, "path": path})

    def on_train_end(self, run: RunInfo, summary: EvalMetrics) -> None:
        # Key order as before the metrics were typed: the evaluation's values, then step and epoch.
        rec = summary.record()
        self._write(
            {
                **{k: v for k, v in rec.items() if k.startswith("val_")},
                "step": summary.step,
                "epoch": summary.epoch,
                "event": "end",
            }
        )
        self.on_close(run)

    def on_close(self, run: RunInfo) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:  # not the main rank, or train start was never called
            return
        record = {**finite_or_none(record), "time": round(time.time(), 3)}
        # allow_nan=False guarantees strict JSON; default=str keeps odd config values loggable.
        self._file.write(json.dumps(record, allow_nan=False, default=str) + "\n")
