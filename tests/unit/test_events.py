"""The run contract (vitlarge/events.py): the events, what they carry, and the order hooks receive them.

The trainer's side of the contract (which events a run emits, when) is in
tests/unit/train/test_trainer.py; the hooks that implement it are in tests/unit/hooks/.
"""

import dataclasses

import pytest

from tests.helpers import ROOT
from vitlarge.config.load import load_recipe
from vitlarge.events import EvalMetrics, Event, Hook, RunInfo, StepMetrics, StopTraining, emit
from vitlarge.plan.plan import make_plan


def step_metrics(step: int = 3, **changes) -> StepMetrics:
    values = dict(
        step=step,
        epoch=0.25,
        train_loss=2.5,
        lr=1e-3,
        grad_norm=1.5,
        loss_scale=1.0,
        images_per_s=100.0,
        images_per_s_per_device=50.0,
        skipped=False,
        data_time=0.01,
        step_time=0.5,
        peak_mem_bytes=1 << 20,
        allreduce_calls=2,
        images=128,
    )
    return StepMetrics(**{**values, **changes})


def run_info(world: int = 2) -> RunInfo:
    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    return RunInfo("runs/x", 1, False, "cpu", 0, make_plan(cfg, world, 1437), cfg, precision="fp32", compile=False)


class Recorder(Hook):
    """Records every call with its arguments, under a name, into a shared list."""

    def __init__(self, name: str, calls: list):
        self.name, self.calls = name, calls

    def on_train_start(self, run):
        self.calls.append((self.name, "train_start", run))

    def on_step_end(self, run, m):
        self.calls.append((self.name, "step_end", run, m))

    def on_eval_end(self, run, m):
        self.calls.append((self.name, "eval_end", run, m))

    def on_checkpoint(self, run, step, path):
        self.calls.append((self.name, "checkpoint", run, step, path))

    def on_train_end(self, run, summary):
        self.calls.append((self.name, "train_end", run, summary))

    def on_export(self, run, path):
        self.calls.append((self.name, "export", run, path))

    def on_close(self, run):
        self.calls.append((self.name, "close", run))


def test_emit_calls_each_event_on_every_hook_in_list_order_with_its_arguments():
    calls, run = [], run_info()
    hooks = [Recorder("a", calls), Recorder("b", calls)]
    m, e = step_metrics(), EvalMetrics(11, 1.0, 0.5, 0.9, 1.2, 360)
    emit(hooks, Event.TRAIN_START, run)
    emit(hooks, Event.STEP_END, run, m)
    emit(hooks, Event.EVAL_END, run, e)
    emit(hooks, Event.CHECKPOINT, run, 11, "runs/x/checkpoints/step_0000011")
    emit(hooks, Event.TRAIN_END, run, e)
    emit(hooks, Event.EXPORT, run, "runs/x/model")
    emit(hooks, Event.CLOSE, run)
    assert calls == [
        ("a", "train_start", run),
        ("b", "train_start", run),
        ("a", "step_end", run, m),
        ("b", "step_end", run, m),
        ("a", "eval_end", run, e),
        ("b", "eval_end", run, e),
        ("a", "checkpoint", run, 11, "runs/x/checkpoints/step_0000011"),
        ("b", "checkpoint", run, 11, "runs/x/checkpoints/step_0000011"),
        ("a", "train_end", run, e),
        ("b", "train_end", run, e),
        ("a", "export", run, "runs/x/model"),
        ("b", "export", run, "runs/x/model"),
        ("a", "close", run),
        ("b", "close", run),
    ]


def test_the_base_hook_accepts_every_event_and_does_nothing():
    run = run_info()
    for event, args in [
        (Event.TRAIN_START, ()),
        (Event.STEP_END, (step_metrics(),)),
        (Event.EVAL_END, (EvalMetrics(1, 0.1, 0.0, 0.0, 2.3, 10),)),
        (Event.CHECKPOINT, (1, "p")),
        (Event.TRAIN_END, (EvalMetrics(1, 0.1, 0.0, 0.0, 2.3, 10),)),
        (Event.EXPORT, ("runs/x/model",)),
        (Event.CLOSE, ()),
    ]:
        emit([Hook()], event, run, *args)  # no AttributeError, no TypeError
    assert {e.value for e in Event} == {
        "train_start",
        "step_end",
        "eval_end",
        "checkpoint",
        "train_end",
        "export",
        "close",
    }


def test_a_step_record_is_every_field_in_order_but_the_image_count():
    m = step_metrics()
    record = m.record()
    assert list(record) == [f.name for f in dataclasses.fields(StepMetrics) if f.name != "images"]
    assert list(record)[:4] == ["step", "epoch", "train_loss", "lr"]  # the order metrics.jsonl writes
    assert record["allreduce_calls"] == 2 and "images" not in record and m.images == 128
    assert step_metrics(allreduce_calls=None).record()["allreduce_calls"] is None  # fsdp: not counted
    assert EvalMetrics(11, 1.0, 0.5, 0.9, 1.2, 360).record() == dict(
        step=11, epoch=1.0, val_top1=0.5, val_top5=0.9, val_loss=1.2, val_images=360
    )


def test_what_hooks_receive_cannot_be_changed_by_a_hook():
    """Every hook sees the same values: a hook that assigned to them would change what the next one logs."""
    m, e, run = step_metrics(), EvalMetrics(11, 1.0, 0.5, 0.9, 1.2, 360), run_info()
    for obj, field in ((m, "train_loss"), (e, "val_top1"), (run, "rank")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, 0)


def test_step_metrics_are_keyword_only_and_the_image_count_is_required():
    with pytest.raises(TypeError):
        StepMetrics(1, 0.1, 2.0, 1e-3, 1.0, 1.0, 1.0, 1.0, False, 0.0, 0.1, 0, 0, 128)  # positional
    values = dataclasses.asdict(step_metrics())
    del values["images"]
    with pytest.raises(TypeError, match="images"):
        StepMetrics(**values)


def test_run_info_world_size_is_the_plans():
    assert run_info(2).world_size == 2 and run_info(4).world_size == 4
    assert issubclass(StopTraining, Exception) and not issubclass(StopTraining, RuntimeError)


def test_closing_goes_on_past_a_hook_that_fails_and_says_so_in_one_line(caplog):
    """TensorBoard's writer re-raises a full disk at close: the next hooks still close, the run's own end stands."""
    from vitlarge.events import close

    class Fails(Hook):
        def on_close(self, run):
            raise OSError(28, "No space left on device")

    calls, run = [], run_info()
    with caplog.at_level("WARNING", logger="vitlarge"):
        close([Recorder("a", calls), Fails(), Recorder("b", calls)], run)
    assert calls == [("a", "close", run), ("b", "close", run)]
    assert [r.getMessage() for r in caplog.records] == [
        "warning: Fails did not close: [Errno 28] No space left on device"
    ]
