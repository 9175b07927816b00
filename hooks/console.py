"""One human-readable progress line every ``log_every`` optimizer steps, and one per evaluation.

Main rank only. Lines go through a rich `Console`; on a terminal rich colours the numbers, and when
stdout is a file or pipe it writes plain text. Lines are never wrapped, so each record stays one
line in a log file and ``grep`` works. The fields are described in docs/LOGS.md.

Window contract: every step since the previous line belongs to the window of the next line.
Measurements (loss, grad norm, throughput, data wait, step time) are window averages; state
(lr, loss scale, epoch) is the value at the window's last step; peak memory is the window's max.
"""

from __future__ import annotations

import math

from rich.console import Console

from vitlarge.events import EvalMetrics, Hook, RunInfo, StepMetrics


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` (hours may exceed 24); ``?`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_bytes(n: float) -> str:
    """MiB below 1 GiB, else GiB with two decimals."""
    if n < 2**30:
        return f"{n / 2**20:.0f} MiB"
    return f"{n / 2**30:.2f} GiB"


def _format_mem(window: list[StepMetrics]) -> str:
    """The window's peak allocated memory; on GPU with its peak reserved (the caching allocator's segments)."""
    allocated = format_bytes(max(w.peak_mem_bytes for w in window))
    reserved = [w.peak_reserved_bytes for w in window if w.peak_reserved_bytes is not None]
    return f"{allocated} ({format_bytes(max(reserved))} reserved)" if reserved else allocated


def _format_scale(x: float) -> str:
    # fp16 scales are powers of two up to 2**24; print them whole, not as 1.67772e+07.
    return f"{x:.0f}" if math.isfinite(x) and x == int(x) else f"{x:g}"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


class PipeSafeConsole(Console):
    """A rich `Console` whose lines stop, not the process, when their reader is gone: rich ends the process with
    status 1 on a broken pipe, and a launcher that exits before its workers (``colossalai run`` on SIGTERM), a
    closed ``| head`` or a lost ``srun`` I/O would then cost the checkpoint a SIGTERM asked for and the run's own
    status (75), as a line on a gone stderr must not (`vitlarge.distributed.process.say`)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is written; rich's default also points fd 1 at /dev/null and exits 1


class ConsoleHook(Hook):
    """Prints a line on the first step, every ``log_every`` steps, and the last step."""

    def __init__(self, log_every: int, console: Console | None = None):
        if log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {log_every}")
        self.log_every = log_every
        self.console = console or PipeSafeConsole(stderr=False)
        self._window: list[StepMetrics] = []
        self._first_step = 1

    def on_train_start(self, run: RunInfo) -> None:
        self._window = []
        self._first_step = run.start_step + 1

    def on_step_end(self, run: RunInfo, m: StepMetrics) -> None:
        if not run.is_main:
            return
        self._window.append(m)
        step = m.step
        if step == self._first_step or step % self.log_every == 0 or step >= run.end_step:
            self._print(self.format_step_line(run, self._window))
            self._window = []

    def on_eval_end(self, run: RunInfo, m: EvalMetrics) -> None:
        if run.is_main:
            top1, top5 = m.val_top1_ema, m.val_top5_ema  # set together (has_ema), or both None
            ema = f" | ema top-1 {100 * top1:.2f}%{_top5(run, top5, ' ')}" if top1 is not None else ""
            self._print(
                f"eval  step {m.step} | epoch {m.epoch:.2f} | top-1 {100 * m.val_top1:.2f}%"
                f"{_top5(run, m.val_top5, ' | ')} | loss {m.val_loss:.4f}{ema} | {m.val_images} images"
            )

    def on_checkpoint(self, run: RunInfo, step: int, path: str) -> None:
        if run.is_main:
            self._print(f"ckpt  step {step} | {path}")

    def on_train_end(self, run: RunInfo, summary: EvalMetrics) -> None:
        if not run.is_main:
            return
        line = f"done  step {summary.step} | top-1 {100 * summary.val_top1:.2f}%{_top5(run, summary.val_top5, ' | ')}"
        top1, top5 = summary.val_top1_ema, summary.val_top5_ema  # set together (has_ema), or both None
        if top1 is not None:
            line += f" | ema top-1 {100 * top1:.2f}%{_top5(run, top5, ' ')}"
        self._print(line)

    @staticmethod
    def format_step_line(run: RunInfo, window: list[StepMetrics]) -> str:
        """The progress line for ``window`` (the steps since the last line, oldest first)."""
        last = window[-1]
        total = run.end_step  # train.max_steps stops the run there: the total and eta are this run's
        step_time = sum(w.step_time for w in window)
        data_time = sum(w.data_time for w in window)
        images_per_s = sum(w.images for w in window) / step_time if step_time > 0 else math.nan
        data_wait = data_time / step_time if step_time > 0 else math.nan
        eta = step_time / len(window) * max(total - last.step, 0)
        # Overflowed fp16 steps report an inf grad norm by contract; averaging it in would hide
        # the real norm, and those steps are counted separately under "skipped".
        grad_norm = _mean([w.grad_norm for w in window if not w.skipped])
        skipped = sum(1 for w in window if w.skipped)
        width = len(str(total))
        return (
            f"train step {last.step:>{width}}/{total} | epoch {last.epoch:.2f} | "
            f"loss {_mean([w.train_loss for w in window]):.4f} | lr {last.lr:.3e} | "
            f"grad {grad_norm:.3f} | scale {_format_scale(last.loss_scale)} | "
            f"{images_per_s:.1f} img/s ({images_per_s / max(run.world_size, 1):.1f}/dev) | "
            f"data {100 * data_wait:.1f}% | eta {format_duration(eta)} | "
            f"mem {_format_mem(window)} | skipped {skipped}"
        )

    def _print(self, line: str) -> None:
        # soft_wrap: never break a record across lines; markup off: paths may contain "[".
        self.console.print(line, soft_wrap=True, markup=False)


def _top5(run: RunInfo, value: float | None, sep: str) -> str:
    """``{sep}top-5 N%``, or nothing where the run has 5 classes or fewer (every image is in its top 5: a 100% that
    measures nothing; metrics.jsonl keeps the value) or no value."""
    return f"{sep}top-5 {100 * value:.2f}%" if value is not None and run.cfg.data.num_classes > 5 else ""
