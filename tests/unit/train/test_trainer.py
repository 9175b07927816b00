"""The training loop (vitlarge/train/loop.py) on the real engine: a Booster (TorchDDPPlugin, gloo group of one).

The trainer's contract: it owns the step counter, emits the events of vitlarge/events.py in the
documented order (train start; a step end per optimizer step; evaluations and checkpoints at their
cadence; a final evaluation, a final checkpoint unless one exists, train end), stops at
``train.max_steps``, and on SIGTERM writes a checkpoint at the next step boundary and raises
`Preempted`, restoring the signal handlers it installed.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from tests.helpers import ROOT
from tests.helpers.plans import OnePhaseLoaders
from vitlarge.checkpoint.trust import layout
from vitlarge.config.load import load_recipe
from vitlarge.errors import Preempted
from vitlarge.events import Hook, RunInfo
from vitlarge.plan.plan import make_plan
from vitlarge.train.assemble import build
from vitlarge.train.loop import Trainer
from vitlarge.train.settings import resolve_settings

N = 160  # training images: 5 steps/epoch at global batch 32
STEPS = 7


@pytest.fixture(scope="module", autouse=True)
def one_thread_group(process_group):
    torch.set_num_threads(1)


class Batches:
    """A batch source as the trainer expects one: ``next()`` gives a micro-batch, ``state()`` its position."""

    def __init__(self, micro_batch: int):
        self.micro_batch, self.taken = micro_batch, 0
        self.g = torch.Generator().manual_seed(0)

    def __next__(self):
        self.taken += 1
        return torch.randn(self.micro_batch, 3, 16, 16, generator=self.g), torch.randint(0, 10, (self.micro_batch,))

    def state(self) -> str:
        return f"micro-batches taken: {self.taken}"


class Log(Hook):
    def __init__(self):
        self.events = []

    def on_train_start(self, run):
        self.events.append(("start", run.start_step))

    def on_step_end(self, run, m):
        self.events.append(("step", m.step))
        self.last = m

    def on_eval_end(self, run, m):
        self.events.append(("eval", m.step))

    def on_checkpoint(self, run, step, path):
        self.events.append(("checkpoint", step))
        assert path == str(layout.list_checkpoints(run.workdir)[-1])  # published when the hook hears of it

    def on_train_end(self, run, summary):
        self.events.append(("end", summary.step))
        self.summary = summary

    def on_export(self, run, path):
        self.events.append(("export", path))

    def on_close(self, run):
        self.events.append(("close",))


class SigtermAt(Hook):
    """Sends this process SIGTERM after step ``step``, as a scheduler's preemption would."""

    sig = signal.SIGTERM

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, run, m):
        if m.step == self.step:
            os.kill(os.getpid(), self.sig)


class SigintAt(SigtermAt):
    """Ctrl-C after step ``step``."""

    sig = signal.SIGINT


class SignalledWhileEntering(OnePhaseLoaders):
    """Loaders whose building receives SIGTERM, as a resume's DALI replay of its position would (DALI holds the
    GIL while it builds: Python's handler runs once the loaders are built)."""

    def enter(self, step: int):
        os.kill(os.getpid(), signal.SIGTERM)
        return super().enter(step)


def trainer(workdir, hooks: list[Hook], start_step: int = 0, loaders=None, resumed_from=None) -> Trainer:
    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    cfg.workdir = str(workdir)
    t = cfg.train
    t.precision, t.global_batch, t.micro_batch = "fp32", 32, 16
    t.max_steps, t.checkpoint_every_steps, t.eval_every_epochs, t.keep_checkpoints = STEPS, 3, 1, 10
    cfg.augment.mixup_alpha = 0.0
    cfg.schedule.warmup_epochs = 0
    plan = make_plan(cfg, 1, N)
    (ph,) = plan.phases
    assert (ph.steps_per_epoch, plan.eval_every_steps, ph.accum_steps) == (5, 5, 2)
    parts = build(cfg, plan, resolve_settings(cfg, "cpu"))
    g = torch.Generator().manual_seed(1)
    val = [(torch.randn(20, 3, 16, 16, generator=g), torch.randint(0, 10, (20,), generator=g)) for _ in range(2)]
    s = parts.settings
    run = RunInfo(str(workdir), 0, True, "cpu", start_step, plan, cfg, precision=s.precision, compile=s.compile)
    loaders = (loaders or OnePhaseLoaders)(Batches(16), val)
    return Trainer(cfg, plan, parts.engine, loaders, hooks, run, resumed_from=resumed_from)


def test_events_come_in_the_documented_order_at_their_cadence(tmp_path):
    log = Log()
    t = trainer(tmp_path, [log])
    final = t.fit(export=lambda: tmp_path / "model")  # the export runs after the end, before the hooks close
    assert log.events == [
        ("start", 0),
        *[("step", 1), ("step", 2), ("step", 3), ("checkpoint", 3), ("step", 4), ("step", 5), ("eval", 5)],
        *[("step", 6), ("checkpoint", 6), ("step", 7)],
        ("eval", 7),  # the final evaluation: max_steps ends the run before the schedule does
        ("checkpoint", 7),
        ("end", 7),
        ("export", str(tmp_path / "model")),
        ("close",),
    ]
    assert t.step == STEPS and final is log.summary and final.val_images == 40
    assert [layout.step_of(p) for p in layout.list_checkpoints(tmp_path)] == [3, 6, 7]
    m = log.last
    assert (m.images, m.epoch, m.loss_scale, m.skipped) == (32, 7 / 5, 1.0, False)
    assert m.images_per_s == pytest.approx(32 / m.step_time) and 0 <= m.data_time <= m.step_time
    assert t.train_loader.taken == 2 * STEPS  # 2 micro-batches per optimizer step


def test_a_run_resumed_at_its_end_evaluates_and_writes_no_second_checkpoint(tmp_path):
    trainer(tmp_path, [Log()]).fit()
    saved = (tmp_path / "checkpoints" / layout.step_name(STEPS) / "meta.json").stat().st_mtime_ns
    log = Log()
    trainer(tmp_path, [log], start_step=STEPS).fit()
    assert log.events == [("start", STEPS), ("eval", STEPS), ("end", STEPS), ("close",)]
    assert (tmp_path / "checkpoints" / layout.step_name(STEPS) / "meta.json").stat().st_mtime_ns == saved


def test_sigterm_checkpoints_at_the_next_step_boundary_and_raises_preempted(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    log = Log()
    t = trainer(tmp_path, [log, SigtermAt(2)])
    with pytest.raises(Preempted) as e:
        t.fit(export=lambda: pytest.fail("a preempted run exports nothing"))
    # The signal lands during step 2's hooks; step 3's all-reduce carries it, so step 3 is the last.
    assert e.value.step == 3 and layout.step_of(e.value.path) == 3
    # The hooks are closed on this way out too: the process leaves with os._exit (launch.leave).
    assert log.events[-3:] == [("step", 3), ("checkpoint", 3), ("close",)] and ("end", 3) not in log.events
    assert "run the same command to resume" in str(e.value)
    assert signal.getsignal(signal.SIGTERM) is before  # the trainer's handler is gone after fit


def test_a_signal_while_a_resume_builds_its_loaders_stops_before_the_first_step(tmp_path):
    """The run stops with the checkpoint it resumed from (exit 75, its usual line), taking no step and writing no
    checkpoint: a first step may compile for minutes, past a scheduler's grace period."""
    log = Log()
    resumed = str(tmp_path / "checkpoints" / layout.step_name(3))
    t = trainer(tmp_path, [log], start_step=3, loaders=SignalledWhileEntering, resumed_from=resumed)
    with pytest.raises(Preempted) as e:
        t.fit(export=lambda: pytest.fail("a preempted run exports nothing"))
    assert (e.value.step, str(e.value.path), e.value.exit_status) == (3, resumed, 75)
    assert str(e.value) == f"stopped on signal after step 3; checkpoint {resumed}; run the same command to resume"
    assert log.events == [("start", 3), ("close",)] and layout.list_checkpoints(tmp_path) == []


def test_a_signal_while_a_fresh_run_builds_its_loaders_checkpoints_after_step_1(tmp_path):
    log = Log()
    with pytest.raises(Preempted) as e:
        trainer(tmp_path, [log], loaders=SignalledWhileEntering).fit()
    assert e.value.step == 1 and log.events[-3:] == [("step", 1), ("checkpoint", 1), ("close",)]


class FailsToClose(Hook):
    def on_close(self, run):
        raise OSError(28, "No space left on device")


def test_a_hook_that_fails_to_close_does_not_replace_the_preemption(tmp_path):
    """The preemption's checkpoint is written; exit 75 (requeue) must not become an OSError's 1."""
    log = Log()
    with pytest.raises(Preempted):
        trainer(tmp_path, [FailsToClose(), log, SigtermAt(2)]).fit()
    assert log.events[-1] == ("close",)


def test_ctrl_c_checkpoints_at_the_next_step_boundary_and_exits_130(tmp_path, capfd):
    """SIGINT is a checkpoint signal too (exit 130, not the requeue's 75); meanwhile a second Ctrl-C would end the
    process at once (SIGINT's default action, tested end to end in tests/e2e/test_launchers.py)."""
    before = signal.getsignal(signal.SIGINT)
    log = Log()
    with pytest.raises(Preempted) as e:
        trainer(tmp_path, [log, SigintAt(2)]).fit()
    assert e.value.step == 3 and e.value.interrupted and e.value.exit_status == 130
    assert str(e.value).startswith("interrupted (Ctrl-C) after step 3; checkpoint ")
    assert log.events[-3:] == [("step", 3), ("checkpoint", 3), ("close",)]
    err = capfd.readouterr().err
    assert err.count("vitlarge: Ctrl-C: saving a checkpoint at the end of this step") == 1
    assert signal.getsignal(signal.SIGINT) is before
