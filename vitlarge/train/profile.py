"""``train.profile_steps``: a window of optimizer steps recorded by ``torch.profiler`` on every rank.

Contract: steps are the trainer's 1-based optimizer steps (one profiler step is one optimizer step, all its
micro-batches), and ``ProfilerStep#N`` in a trace is optimizer step N. A step's span runs from the previous
step's end event to its own: its loader wait, forward and backward, collectives, optimizer and the hooks'
work on it; the evaluation or checkpoint after a step falls in the next one. `StepProfiler` is a hook the
trainer appends last when the window has steps in this run (none otherwise: no object, no cost), so the
other hooks' work on a step is inside it. It starts one step early where the run has that step (a warmup
step: the profiler's start-up cost stays out of the record), records the window and, at the window's last
step, writes ``<workdir>/profile/steps<A>-<B>/rank<R>.pt.trace.json`` (Chrome trace format: Perfetto loads it, and
TensorBoard's profiler plugin, ``tensorboard --logdir <workdir>/profile``, shows each window as a run of one worker
per rank) and prints on rank 0 the operators that took the most self time. A run
that stops inside the window (preempted, an error) writes no trace. The CPU is always recorded; CUDA kernels
too where the run's device is a GPU.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vitlarge.config.profile_window import parse_step_window
from vitlarge.config.schema import Config
from vitlarge.errors import UserError
from vitlarge.events import Hook, RunInfo, StepMetrics
from vitlarge.fileio import UnsafeFile, check_inside, fsync_dir, fsync_path, remove_name
from vitlarge.plan.plan import Plan

if TYPE_CHECKING:
    import torch.profiler

log = logging.getLogger("vitlarge")

PROFILE_DIRNAME = "profile"
TOP_OPERATORS = 10


@dataclass(frozen=True)
class Recorded:
    """The optimizer steps ``first..last`` (1-based, inclusive) this run records, after ``warmup`` steps."""

    first: int
    last: int
    warmup: int


def record_window(window: tuple[int, int], start_step: int, end_step: int) -> Recorded | None:
    """The part of ``window`` a run that starts after ``start_step`` optimizer steps and stops at ``end_step``
    takes; None when it takes none of it. One warmup step where the run takes the step before the window."""
    first, last = max(window[0], start_step + 1), min(window[1], end_step)
    if first > last:
        return None
    return Recorded(first, last, warmup=min(1, first - (start_step + 1)))


def _end_step(cfg: Config, plan: Plan) -> tuple[int, str]:
    """The run's last step and what sets it (`vitlarge.events.RunInfo.end_step`)."""
    t = cfg.train
    if t.max_steps and t.max_steps < plan.total_steps:
        return t.max_steps, f"train.max_steps={t.max_steps}"
    return plan.total_steps, f"the schedule's {plan.total_steps} steps"


def check_window(cfg: Config, plan: Plan) -> None:
    """One `UserError` when ``train.profile_steps`` ends after the run's last step (the config's own checks are
    `vitlarge.config.profile_window`'s): with the plan, before any data is read."""
    if cfg.train.profile_steps is None:
        return
    _, end = parse_step_window(cfg.train.profile_steps)
    last, why = _end_step(cfg, plan)
    if end > last:
        raise UserError(
            f"train.profile_steps={cfg.train.profile_steps} ends after step {last}, the run's last ({why}); "
            f"end the window by step {last}"
        )


def step_profiler(run: RunInfo) -> StepProfiler | None:
    """The hook that records ``train.profile_steps`` in this run; None when unset or already done (said once)."""
    text = run.cfg.train.profile_steps
    if text is None:
        return None
    steps = record_window(parse_step_window(text), run.start_step, run.end_step)
    if steps is None:
        if run.is_main:
            log.info(
                f"profile: train.profile_steps={text} was done before this run resumed at step {run.start_step}; "
                "nothing to profile"
            )
        return None
    return StepProfiler(steps, run)


def _check_complete(path: Path) -> None:
    """OSError unless the exported trace ends its JSON document (a closing brace after the last events)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - 64))
        tail = f.read().rstrip()
    if not tail.endswith(b"}"):
        raise OSError(f"the profiler wrote an incomplete trace ({size:,} bytes; is the disk full?)")


class StepProfiler(Hook):
    """Records optimizer steps ``steps.first..steps.last`` of this process (see the module docstring)."""

    def __init__(self, steps: Recorded, run: RunInfo):
        self.steps = steps
        self.folder = Path(run.workdir) / PROFILE_DIRNAME / f"steps{steps.first}-{steps.last}"
        self.path = self.folder / f"rank{run.rank}.pt.trace.json"
        self.cuda = run.device.startswith("cuda")
        self._prof = None
        if run.is_main:
            log.info(
                f"profile: optimizer steps {steps.first}-{steps.last} on every rank -> {self.folder}/rank<R>.pt.trace.json"
            )

    def on_train_start(self, run: RunInfo) -> None:
        self._begin_before(run.start_step + 1)

    def on_step_end(self, run: RunInfo, m: StepMetrics) -> None:
        if self._prof is None:
            self._begin_before(m.step + 1)
        elif m.step == self.steps.last:
            self._finish(run)
        else:
            self._prof.step()

    def on_close(self, run: RunInfo) -> None:
        """Stopped inside the window: the profiler stops, and what it recorded is dropped."""
        if self._prof is not None:
            self._prof.stop()
            self._prof = None

    def _begin_before(self, step: int) -> None:
        """Starts the profiler if optimizer step ``step`` (about to run) is the warmup step or the window's first."""
        if step != self.steps.first - self.steps.warmup:
            return
        import torch  # lazy: keeps torch off train.py until the thread pools are sized
        from torch.profiler import (  # lazy: keeps torch off train.py until the thread pools are sized
            ProfilerAction,
            ProfilerActivity,
            profile,
        )

        first, last = self.steps.first, self.steps.last

        def action(n: int) -> ProfilerAction:  # ``n``: the profiler's step number, the optimizer step it times
            if n < first:
                return ProfilerAction.WARMUP if n >= first - self.steps.warmup else ProfilerAction.NONE
            return ProfilerAction.RECORD_AND_SAVE if n == last else ProfilerAction.RECORD

        activities = [ProfilerActivity.CPU]
        if self.cuda and torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, schedule=action, record_shapes=False)
        # The profiler counts its steps from 0; from here they count optimizer steps, so that the trace's
        # ProfilerStep#N is optimizer step N (what the window, the console and metrics.jsonl say).
        prof.step_num = step
        prof.current_action = action(step)
        with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": there is one cycle
            warnings.filterwarnings("ignore", message=".*Profiler clears events", category=UserWarning)
            prof.start()
        self._prof = prof

    def _finish(self, run: RunInfo) -> None:
        """The window's last step is done: stop, write this rank's trace and (rank 0) print the table."""
        prof, self._prof = self._prof, None
        assert prof is not None  # called after _start, once
        prof.stop()
        try:
            self._write(prof, run)
        except OSError as e:  # a diagnostic: a full disk or a planted link costs the trace, not the run
            log.warning(f"warning: profile: could not write {self.path}: {e.strerror or e}")
        if run.is_main:
            log.info(f"profile: top {TOP_OPERATORS} operators of rank 0, steps {self.steps.first}-{self.steps.last}")
            for sort_by in ["self_cpu_time_total"] + (["self_device_time_total"] if self.cuda else []):
                log.info(prof.key_averages().table(sort_by=sort_by, row_limit=TOP_OPERATORS))

    def _write(self, prof: torch.profiler.profile, run: RunInfo) -> None:
        """The trace under its final name only once complete: exported in a private temporary folder beside it
        (named so that TensorBoard's plugin never reads it as a trace), checked to end as a whole JSON document
        (kineto does not report a failed write: a full disk truncates silently), then renamed (a crash leaves no
        partial trace under the name; a link planted there is replaced). Rank 0 also removes the traces of ranks
        this world does not have, left by an earlier attempt of the window with more ranks."""
        try:  # before the folder is made: a ``profile`` link planted in a handed-over workdir leads elsewhere
            check_inside(self.folder, run.workdir)
        except UnsafeFile as e:
            raise OSError(e.errno, e.strerror, str(self.folder)) from None
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".rank{run.rank}.partial.", dir=self.folder))
        part = tmp / "trace.json.partial"
        try:
            prof.export_chrome_trace(str(part))
            _check_complete(part)
            fsync_path(part)
            os.replace(part, self.path)
            if run.is_main:
                for stale in self.folder.glob("rank*.pt.trace.json"):
                    rank = stale.name[len("rank") : -len(".pt.trace.json")]
                    if rank.isdigit() and int(rank) >= run.world_size:
                        remove_name(stale)
            fsync_dir(self.folder)
        finally:
            remove_name(part)
            os.rmdir(tmp)
