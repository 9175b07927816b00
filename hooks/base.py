"""The events a training run emits, in order, and the no-op base class hooks derive from.

Contract (who calls what, with which values):

* ``on_train_start(run)`` once per process, before the first step. ``run`` is a `RunInfo`.
* ``on_step_end(run, m)`` after every optimizer step. ``m`` is a dict with at least:
  ``step`` (int, optimizer steps done, 1-based), ``epoch`` (float, epochs done),
  ``train_loss`` (float, mean over ranks of this step's micro-batch losses; may be nan/inf),
  ``lr`` (float), ``grad_norm`` (float, global norm after unscaling, before clipping; nan or inf
  when the step overflowed), ``loss_scale`` (float, 1.0 without fp16), ``skipped`` (bool, fp16
  overflow skipped the update), ``images`` (int, images in this optimizer step over all ranks
  = the global batch), ``step_time`` (float s, wall time of this step), ``data_time`` (float s,
  of which waiting for the loader), ``images_per_s`` (float, all ranks), ``images_per_s_per_device``
  (float), ``peak_mem_bytes`` (int, this process: CUDA max allocated on GPU, max RSS on CPU),
  ``allreduce_calls`` (int, gradient all-reduce calls this step on this rank; DDP buckets).
  Every rank receives the same values for the loss and the optimizer fields.
* ``on_eval_end(run, m)``: ``m`` has ``step``, ``epoch``, ``val_top1``, ``val_top5`` (fractions in
  0..1), ``val_loss``, ``val_images`` (int, images counted over all ranks).
* ``on_checkpoint(run, step, path)`` after a checkpoint is complete under its final name.
* ``on_train_end(run, summary)`` once, after the final evaluation; ``summary`` holds the last eval
  metrics and ``step``.

Hooks log only where ``run.is_main`` unless they say otherwise; a hook that must stop training
raises `StopTraining` (all ranks see the same values, so they all raise at the same step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class StopTraining(Exception):
    """Raised by a hook to end the run with an error; the message says why and what to do."""


@dataclass
class RunInfo:
    """What a hook may know about the run. Read-only by convention."""

    workdir: str
    rank: int
    world_size: int
    is_main: bool
    device: str
    global_batch: int
    micro_batch: int
    accum_steps: int
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    start_step: int
    config: dict[str, Any] = field(default_factory=dict)


class Hook:
    """No-op base: override the events you need."""

    def on_train_start(self, run: RunInfo) -> None:
        pass

    def on_step_end(self, run: RunInfo, m: dict[str, Any]) -> None:
        pass

    def on_eval_end(self, run: RunInfo, m: dict[str, Any]) -> None:
        pass

    def on_checkpoint(self, run: RunInfo, step: int, path: str) -> None:
        pass

    def on_train_end(self, run: RunInfo, summary: dict[str, Any]) -> None:
        pass
