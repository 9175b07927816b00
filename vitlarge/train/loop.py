"""The loop: optimizer steps, evaluation and checkpoint cadence, preemption, and hook events.

Contract: the trainer owns the step counter (optimizer steps done, restored from the checkpoint),
emits the events of `vitlarge.events` in the order documented there and never formats a log line
itself. ``train_loader`` is any batch source: ``next()`` gives ``(images, labels)`` of one micro-batch
and ``state()`` what a checkpoint stores to resume it (tests wrap it to inject faults).

All ranks take the same decisions: the loss, the stop request (a signal delivered to any rank) and the
hooks' view of the step are all-reduced once per optimizer step in one small message.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time

import torch
import torch.distributed as dist

from vitlarge.checkpoint.checkpointer import Checkpointer
from vitlarge.config.schema import Config
from vitlarge.data.phased import PhasedLoaders, release_loader_memory
from vitlarge.distributed.collective import rank0_decides
from vitlarge.distributed.process import say
from vitlarge.distributed.timeouts import set_collective_timeout
from vitlarge.errors import Preempted
from vitlarge.events import EvalMetrics, Event, Hook, RunInfo, StepMetrics, close, emit
from vitlarge.plan.plan import Plan
from vitlarge.train.compile_stats import compile_stats
from vitlarge.train.engine import Engine
from vitlarge.train.memory import peak_memory
from vitlarge.train.profile import step_profiler
from vitlarge.train.validation import evaluate

log = logging.getLogger("vitlarge")


class Trainer:
    def __init__(
        self,
        cfg: Config,
        plan: Plan,
        engine: Engine,
        loaders: PhasedLoaders,
        hooks: list[Hook],
        info: RunInfo,
        resumed_from: str | None = None,
        checkpoints: Checkpointer | None = None,
    ):
        """``loaders`` gives each phase's train and validation loaders, built at the phase's first step.
        ``info``: the run as its hooks see it; the loop starts at its ``start_step`` and its checkpoints' meta.json
        records its ``lineage`` as their ``line`` (vitlarge/checkpoint/resume.py).
        ``resumed_from``: the checkpoint this run resumed from (at ``info.start_step``), None for a fresh run.
        ``checkpoints``: the run's checkpointer (by default one over ``cfg.workdir`` and the engine's parts)."""
        self.lineage, self.resumed_from = info.lineage, resumed_from
        self.cfg, self.plan, self.engine = cfg, plan, engine
        self.checkpoints = checkpoints or Checkpointer(cfg.workdir, cfg, info.rank).attach(
            engine.model, engine.optimizer, engine.precision.scaler, engine.ema
        )
        self.loaders = loaders
        self.train_loader = self.val_loader = None
        profiler = step_profiler(info)  # train.profile_steps: last, so that the other hooks' work is in its steps
        self.hooks, self.info = [*hooks, profiler] if profiler else hooks, info
        self.step = info.start_step
        self.device = engine.params[0].device
        self._stop_signal = 0

    def _on_signal(self, signum, frame):
        if signum == signal.SIGINT:
            # Ctrl-C: checkpoint at this step's end, like a scheduler's signal. The second one ends the process
            # at once, even inside a collective or a checkpoint write (the default action, not Python's handler).
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if self.info.is_main:
                say("vitlarge: Ctrl-C: saving a checkpoint at the end of this step; Ctrl-C again leaves without it")
        if not self._stop_signal or signum == signal.SIGINT:
            self._stop_signal = signum

    def _emit(self, event: Event, *args) -> None:
        emit(self.hooks, event, self.info, *args)

    def _stop_requested(self) -> tuple[bool, bool]:
        """Whether any rank was asked to stop and whether any by Ctrl-C, in one all-reduce (`_sync` without a loss)."""
        flags = torch.tensor(
            [float(self._stop_signal > 0), float(self._stop_signal == signal.SIGINT)], device=self.device
        )
        if dist.is_initialized():
            dist.all_reduce(flags)
        stop, interrupted = flags.tolist()
        return stop > 0, interrupted > 0

    def _sync(self, loss: torch.Tensor) -> tuple[float, bool, bool]:
        """Mean loss over ranks, whether any rank was asked to stop and whether any by Ctrl-C, in one all-reduce."""
        flags = [float(self._stop_signal > 0), float(self._stop_signal == signal.SIGINT)]
        buf = torch.cat([loss.float().reshape(1), torch.tensor(flags, device=loss.device)])
        if dist.is_initialized():
            dist.all_reduce(buf)
        loss_sum, stop, interrupted = buf.tolist()
        return loss_sum / self.plan.world_size, stop > 0, interrupted > 0

    def _evaluate(self) -> EvalMetrics:
        """The raw weights, and beside them the model EMA's (swapped into the model for its pass)."""
        with self._slow_collectives():
            return self._evaluate_now()

    def _evaluate_now(self) -> EvalMetrics:
        val = self.val_loader
        assert val is not None, "evaluated before a phase's loaders were made"
        found = evaluate(self.engine.model, val, self.engine.precision)
        if self.engine.ema is not None:
            with self.engine.ema.swapped_into():
                ema = evaluate(self.engine.model, val, self.engine.precision)
            found.update({f"{k}_ema": ema[k] for k in ("val_top1", "val_top5", "val_loss")})
        m = EvalMetrics(step=self.step, epoch=self.plan.epoch_at(self.step), **found)
        self._emit(Event.EVAL_END, m)
        return m

    @contextlib.contextmanager
    def _slow_collectives(self):
        """Evaluations (the first one compiles eval's graph) and checkpoints (every rank's shard written and read
        back before the commit's gather; minutes for a 10 GB state on a busy shared filesystem) wait
        ``train.init_timeout_s`` in their collectives, not ``train.collective_timeout_s``: that one is for the
        training steps, where a long wait means a hang."""
        set_collective_timeout(self.cfg.train.init_timeout_s)
        yield  # not in a finally: a collective that timed out in here is reported with the timeout it waited
        set_collective_timeout(self.cfg.train.collective_timeout_s)

    def _checkpoint(self):
        with self._slow_collectives():
            return self._save()

    def _save(self):
        # meta.json's config is the run's record: precision and compile as resolved, not the recipe's "auto"
        assert self.train_loader is not None, "saved before a phase's loaders were made"
        path = self.checkpoints.save(
            self.step,
            self.train_loader.state(),
            self.lineage,
            config=self.info.record,
            schedule=self.plan.record(self.step),
        )
        self._emit(Event.CHECKPOINT, self.step, str(path))
        return path

    def _enter_phase(self, step: int | None = None) -> bool:
        """At a phase boundary (or the first step), the phase's loaders replace the previous ones. Returns whether
        they did: until that step completes, collectives wait ``train.init_timeout_s`` (new shapes recompile, the
        new pipelines fill their buffers, at each rank's own pace)."""
        step = self.step if step is None else step
        if not self.loaders.changes_at(step):
            return False
        set_collective_timeout(self.cfg.train.init_timeout_s)
        # The old pipelines go (threads, pinned and device pools) before the new ones are built.
        self.train_loader = self.val_loader = None
        release_loader_memory(self.device)
        entered = self.loaders.enter(step)
        assert entered is not None  # changes_at(step)
        self.train_loader, self.val_loader = entered
        return True

    def fit(self, export=None) -> EvalMetrics:
        """Trains to the end; then ``export()`` (every rank; it returns the exported folder on the main rank, else
        None) and `Event.EXPORT`, before the hooks close (a tracker uploads the folder)."""
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
        try:
            final = self._fit()
            if export is not None:
                path = export()
                if path is not None:
                    self._emit(Event.EXPORT, str(path))
            return final
        finally:
            # Before the handlers go: a launcher's SIGTERM (torchrun's, once another rank has left with 75) must
            # not end this process while TensorBoard writes its last events.
            close(self.hooks, self.info)
            for s, handler in old.items():
                signal.signal(s, handler)

    def _fit(self) -> EvalMetrics:
        t, plan = self.cfg.train, self.plan
        end = self.info.end_step
        first = True
        self._emit(Event.TRAIN_START)
        while self.step < end:
            warming = self._enter_phase()
            if warming and self.resumed_from is not None and self.step == self.info.start_step:
                # A resume's loaders replay the checkpoint's position while they build (DALI holds the GIL: a
                # signal is seen only once they are built). A signal that came meanwhile stops the run here, the
                # checkpoint it resumed from still the newest, not after a step (a first step may compile).
                stop, interrupted = self._stop_requested()
                if stop:
                    raise Preempted(self.step, self.resumed_from, interrupted)
            loader = self.train_loader
            assert loader is not None  # the first step enters its phase
            t0 = time.perf_counter()
            out = self.engine.step(self.step, loader.__next__)
            loss, stop, interrupted = self._sync(
                out.loss
            )  # its .tolist() waits for the device: dt is the real step time
            if warming:  # every rank has compiled, filled and synchronised: a wait this long now is a hang
                set_collective_timeout(t.collective_timeout_s)
            self.step += 1
            dt = time.perf_counter() - t0
            if first and self.info.compile:  # the step that compiled: what Dynamo made of the model
                log.info(compile_stats().line())
                first = False
            batch = plan.phase_at(self.step - 1).global_batch
            allocated, reserved = peak_memory(self.device)
            m = StepMetrics(
                step=self.step,
                epoch=plan.epoch_at(self.step),
                train_loss=loss,
                lr=out.lr,
                grad_norm=out.grad_norm,
                loss_scale=out.loss_scale,
                skipped=out.skipped,
                images=batch,
                step_time=dt,
                data_time=out.data_time,
                images_per_s=batch / dt,
                images_per_s_per_device=batch / dt / plan.world_size,
                peak_mem_bytes=allocated,
                peak_reserved_bytes=reserved,
                allreduce_calls=out.allreduce_calls,
            )
            self._emit(Event.STEP_END, m)
            if plan.eval_every_steps and self.step % plan.eval_every_steps == 0 and self.step < end:
                self._evaluate()
            if stop:
                raise Preempted(self.step, self._checkpoint(), interrupted)
            if t.checkpoint_every_steps and self.step % t.checkpoint_every_steps == 0 and self.step < end:
                self._checkpoint()
        if self.val_loader is None:  # resumed at the very end: no step ran
            self._enter_phase(self.step - 1)
        final = self._evaluate()
        # Rank 0 looks, all ranks follow: the save is a collective, so the answer must be the same everywhere.
        if not rank0_decides(lambda: self.checkpoints.has(self.step)):
            self._checkpoint()
        if self.info.compile:  # eval's and later phases' graphs: recompiles
            log.info(compile_stats().line())
        self._emit(Event.TRAIN_END, final)
        return final
