"""The run contract: the events a training run emits, what they carry, and the hook base class.

The trainer (`vitlarge.train.loop`) emits; observers in ``hooks/`` implement `Hook`. In order:

* `Event.TRAIN_START` -> ``on_train_start(run)`` once per process, before the first step.
* `Event.STEP_END` -> ``on_step_end(run, m: StepMetrics)`` after every optimizer step.
* `Event.EVAL_END` -> ``on_eval_end(run, m: EvalMetrics)`` after every evaluation.
* `Event.CHECKPOINT` -> ``on_checkpoint(run, step, path)`` after a checkpoint is complete under
  its final name.
* `Event.TRAIN_END` -> ``on_train_end(run, summary: EvalMetrics)`` once, after the final
  evaluation; ``summary`` is that evaluation (its ``step`` is the last step).
* `Event.EXPORT` -> ``on_export(run, path)`` once after TRAIN_END, when the run exported the timm
  folder ``path`` (``<workdir>/model``); the picture of the run (``metrics.png``) is drawn by then.
* `Event.CLOSE` -> ``on_close(run)`` once, last, however the run ends: done, stopped by a hook,
  preempted (exit 75), an error. Files are flushed and closed here: the process then leaves with
  ``os._exit`` (`vitlarge.distributed.process.leave`), which runs no finalizers.

Hooks log only where ``run.is_main`` unless they say otherwise; a hook that must stop training
raises `StopTraining` (all ranks see the same values, so they all raise at the same step).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from vitlarge.config.schema import Config
from vitlarge.plan.plan import Plan


def finite_or_none(x: Any) -> Any:
    """``x`` with every NaN or inf float (nested in dicts, lists and tuples too) replaced by None: JSON has no
    NaN, so metrics.jsonl and `vitlarge.evaluate --json` write null for a value that is not finite."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    return x


class StopTraining(Exception):
    """Raised by a hook to end the run with an error; the message says why and what to do."""


class Event(enum.Enum):
    TRAIN_START = "train_start"
    STEP_END = "step_end"
    EVAL_END = "eval_end"
    CHECKPOINT = "checkpoint"
    TRAIN_END = "train_end"
    EXPORT = "export"
    CLOSE = "close"


@dataclass(frozen=True)
class RunInfo:
    """What a hook may know about the run: where it writes, who this process is, the plan and config."""

    workdir: str
    rank: int
    is_main: bool
    device: str
    start_step: int
    """Optimizer steps done when this process started (0, or the resumed checkpoint's step)."""
    plan: Plan
    cfg: Config
    lineage: str | None = None
    """The checkpoint lineage this run's saves belong to (meta.json's ``line``: `vitlarge.checkpoint.resume`); None:
    the lineage that started from scratch in this workdir. Trackers keep one tracked run per lineage."""
    parent_lineage: str | None = None
    """The lineage of the checkpoint this run resumed from, as its meta.json named it; not ``lineage`` after a
    ``--resume`` of an older checkpoint, which starts a new lineage."""
    precision_why: str = ""
    """Why the run trains in ``precision`` where it was not the recipe's plain choice (``auto``'s pick, a
    slow CPU's fp16): `vitlarge.train.settings.Settings.precision_why`."""
    precision: str = field(kw_only=True)
    """What the run trains in (`vitlarge.train.settings.Settings.precision`: ``train.precision`` resolved; ``cfg``
    keeps ``auto`` as the recipe wrote it). Required: the settings are the one source, there is no default."""
    compile: bool = field(kw_only=True)
    """Whether the model's forward is compiled (`vitlarge.train.settings.Settings.compile`). Required, as above."""

    @property
    def record(self) -> dict:
        """The config as the run's records show it (metrics.jsonl's start record, the trackers' parameters, each
        checkpoint's meta.json): ``cfg``'s dict with ``precision`` and compile ``on``/``off`` in place of what the
        recipe wrote (``auto``). A dict for files; nothing reads a setting back from it."""
        d = self.cfg.to_dict()
        d["train"] = {**d["train"], "precision": self.precision, "compile": "on" if self.compile else "off"}
        return d

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def end_step(self) -> int:
        """The step this run stops at: ``train.max_steps`` where it is set and below the plan's total (the
        schedule still spans ``plan.total_steps``)."""
        t = self.cfg.train
        return min(self.plan.total_steps, t.max_steps) if t.max_steps else self.plan.total_steps


@dataclass(frozen=True, kw_only=True)
class StepMetrics:
    """One optimizer step, as every hook receives it. Fields in the order metrics.jsonl writes them.

    Every rank receives the same values for the loss and the optimizer fields.
    """

    step: int
    """Optimizer steps done, 1-based."""
    epoch: float
    """Epochs done."""
    train_loss: float
    """Mean over ranks of this step's micro-batch losses; may be nan/inf."""
    lr: float
    grad_norm: float
    """Global norm after unscaling, before clipping; nan or inf when the step overflowed."""
    loss_scale: float
    """1.0 without fp16."""
    images_per_s: float
    """All ranks."""
    images_per_s_per_device: float
    skipped: bool
    """An fp16 overflow (or non-finite gradients) skipped the update."""
    data_time: float
    """Seconds of ``step_time`` spent waiting for the loader."""
    step_time: float
    """Wall seconds of this step."""
    peak_mem_bytes: int
    """This process: CUDA max allocated on GPU, max RSS on CPU."""
    peak_reserved_bytes: int | None = None
    """This process on GPU: CUDA max reserved (the caching allocator's segments: what the GPU holds for
    tensors, fragmentation included); None on CPU. `vitlarge.train.memory.peak_memory`."""
    allreduce_calls: int | None = 0
    """Gradient all-reduce calls this step on this rank (DDP buckets); None under fsdp (not counted)."""
    images: int
    """Images in this optimizer step over all ranks (the global batch); not logged, summed by the console."""

    def record(self) -> dict[str, Any]:
        """The fields metrics.jsonl writes for a ``train`` record, in order."""
        d = dataclasses.asdict(self)
        del d["images"]
        return d


@dataclass(frozen=True)
class EvalMetrics:
    """One evaluation over the whole validation split."""

    step: int
    epoch: float
    val_top1: float
    """Fraction in 0..1."""
    val_top5: float
    val_loss: float
    """Mean cross-entropy."""
    val_images: int
    """Images counted over all ranks."""
    val_top1_ema: float | None = None
    """The model EMA's top-1 on the same images (``train.ema_decay``); None without an EMA."""
    val_top5_ema: float | None = None
    val_loss_ema: float | None = None

    @property
    def has_ema(self) -> bool:
        return self.val_top1_ema is not None

    def record(self) -> dict[str, Any]:
        """The fields metrics.jsonl writes; the ``*_ema`` ones only where the run has an EMA."""
        d = dataclasses.asdict(self)
        return {k: v for k, v in d.items() if not (k.endswith("_ema") and v is None)}


class Hook:
    """No-op base: override the events you need."""

    def on_train_start(self, run: RunInfo) -> None:
        pass

    def on_step_end(self, run: RunInfo, m: StepMetrics) -> None:
        pass

    def on_eval_end(self, run: RunInfo, m: EvalMetrics) -> None:
        pass

    def on_checkpoint(self, run: RunInfo, step: int, path: str) -> None:
        pass

    def on_train_end(self, run: RunInfo, summary: EvalMetrics) -> None:
        pass

    def on_export(self, run: RunInfo, path: str) -> None:
        pass

    def on_close(self, run: RunInfo) -> None:
        pass


def close(hooks: list[Hook], run: RunInfo) -> None:
    """`Event.CLOSE` on every hook, each on its own: a hook that fails here (TensorBoard's writer re-raises a
    full disk or a stale NFS handle) is one warning line, and neither stops the others' closing nor replaces
    how the run ended (a preemption must still exit 75)."""
    for hook in hooks:
        try:
            hook.on_close(run)
        except Exception as e:
            logging.getLogger("vitlarge").warning(f"warning: {type(hook).__name__} did not close: {e}")


def emit(hooks: list[Hook], event: Event, run: RunInfo, *args: Any) -> None:
    """Calls ``event`` on each hook in list order."""
    for hook in hooks:
        match event:
            case Event.TRAIN_START:
                hook.on_train_start(run)
            case Event.STEP_END:
                hook.on_step_end(run, *args)
            case Event.EVAL_END:
                hook.on_eval_end(run, *args)
            case Event.CHECKPOINT:
                hook.on_checkpoint(run, *args)
            case Event.TRAIN_END:
                hook.on_train_end(run, *args)
            case Event.EXPORT:
                hook.on_export(run, *args)
            case Event.CLOSE:
                hook.on_close(run)
