"""TensorBoard scalars under ``<workdir>/tb``, at the optimizer step.

Main rank only. The writer is created at train start (so building the hook list costs nothing and
non-main ranks never import TensorBoard), flushed after each evaluation and closed when the run ends
(``on_close``: finished, preempted or stopped).

Tags: ``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/loss_scale``, ``train/skipped``
(1 on an fp16 overflow step), ``perf/images_per_s`` (all devices), ``perf/data_wait`` (fraction of
the step spent waiting for data), ``mem/peak_gib``, ``val/top1``, ``val/top5`` (fractions in 0..1,
as in metrics.jsonl), ``val/loss``. Non-finite values are not written: one inf grad norm would
flatten the whole chart; the gap shows where they were, and metrics.jsonl has every step.

The folder must resolve inside the workdir: a ``tb`` link planted in a handed-over workdir stops the
run with one line rather than carrying the event files elsewhere.

On resume the writer purges the events after the checkpoint's step, so TensorBoard shows one
curve, not the rolled-back attempt overlaid on the resumed one.
"""

from __future__ import annotations

import math
import os

from vitlarge.errors import UserError
from vitlarge.events import EvalMetrics, Hook, RunInfo, StepMetrics
from vitlarge.fileio import UnsafeFile, check_inside
from vitlarge.report.metrics_log import TB_DIRNAME


class TensorBoardHook(Hook):
    """Writes the run's scalars with ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.logdir = os.path.join(workdir, TB_DIRNAME)
        self._writer = None

    def on_train_start(self, run: RunInfo) -> None:
        if not run.is_main:
            return
        try:
            check_inside(self.logdir, self.workdir)
        except UnsafeFile as e:
            raise UserError(f"{self.logdir}: {e.strerror}; remove the link and run again") from None
        from torch.utils.tensorboard import SummaryWriter  # lazy: TensorBoard, off the other ranks' start-up

        # purge_step makes TensorBoard drop earlier events at steps >= it, i.e. the steps a
        # resumed run is about to log again.
        purge = run.start_step + 1 if run.start_step > 0 else None
        self._writer = SummaryWriter(self.logdir, purge_step=purge)

    def on_step_end(self, run: RunInfo, m: StepMetrics) -> None:
        step = m.step
        self._add("train/loss", m.train_loss, step)
        self._add("train/lr", m.lr, step)
        self._add("train/grad_norm", m.grad_norm, step)
        self._add("train/loss_scale", m.loss_scale, step)
        self._add("train/skipped", float(m.skipped), step)
        self._add("perf/images_per_s", m.images_per_s, step)
        if m.step_time > 0:
            self._add("perf/data_wait", m.data_time / m.step_time, step)
        self._add("mem/peak_gib", m.peak_mem_bytes / 2**30, step)

    def on_eval_end(self, run: RunInfo, m: EvalMetrics) -> None:
        step = m.step
        self._add("val/top1", m.val_top1, step)
        self._add("val/top5", m.val_top5, step)
        self._add("val/loss", m.val_loss, step)
        for tag, value in (("top1_ema", m.val_top1_ema), ("top5_ema", m.val_top5_ema), ("loss_ema", m.val_loss_ema)):
            if value is not None:  # all three, with an EMA (has_ema)
                self._add(f"val/{tag}", value, step)
        if self._writer is not None:
            self._writer.flush()

    def on_train_end(self, run: RunInfo, summary: EvalMetrics) -> None:
        self.on_close(run)

    def on_close(self, run: RunInfo) -> None:
        """Also after a preemption or a stop: the events since the last evaluation are written."""
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None

    def _add(self, tag: str, value: float, step: int) -> None:
        if self._writer is not None and math.isfinite(value):
            self._writer.add_scalar(tag, value, step)
