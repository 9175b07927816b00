"""The profiler window (vitlarge/train/profile.py): which optimizer steps a run records, and real traces.

`record_window` is the arithmetic: a window of 1-based optimizer steps, clipped to the steps this run takes
(a resumed run starts after its checkpoint's step), with one warmup step where the run has one before the
window. `StepProfiler` is driven here with the events the trainer emits around real work (a small MLP's
forward and backward per step): one trace for the window's steps only, named ``ProfilerStep#<optimizer
step>``, the operator table on the main rank. A real 2-rank run: tests/e2e/test_synthetic_runs.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tests.helpers.plans import one_phase_plan
from vitlarge.config.schema import Config
from vitlarge.errors import UserError
from vitlarge.events import Event, RunInfo, StepMetrics, close, emit
from vitlarge.train.profile import PROFILE_DIRNAME, Recorded, StepProfiler, check_window, record_window, step_profiler

PLAN = one_phase_plan(1, 32, 16, 2, 10, 660, warmup_steps=0, eval_every_steps=0, num_train_examples=320)


@pytest.mark.parametrize(
    "window, start_step, end_step, expected",
    [
        ((100, 105), 0, 1000, Recorded(100, 105, warmup=1)),  # steps 1-98 run unprofiled, 99 warms up
        ((1, 3), 0, 1000, Recorded(1, 3, warmup=0)),  # the run's first step: nothing before it to warm up on
        ((100, 105), 98, 1000, Recorded(100, 105, warmup=1)),  # resumed at 98: step 99 warms up
        ((100, 105), 99, 1000, Recorded(100, 105, warmup=0)),  # resumed at 99: step 100 is this run's first
        ((100, 105), 102, 1000, Recorded(103, 105, warmup=0)),  # partly done before the resume: the rest
        ((100, 105), 104, 1000, Recorded(105, 105, warmup=0)),
        ((100, 105), 105, 1000, None),  # all of it done before the resume
        ((100, 105), 500, 1000, None),
        ((100, 105), 0, 103, Recorded(100, 103, warmup=1)),  # clipped to the run's last step
        ((100, 105), 0, 99, None),
    ],
)
def test_the_window_is_the_steps_this_run_takes(window, start_step, end_step, expected):
    assert record_window(window, start_step, end_step) == expected


def make_run(workdir, profile_steps: str | None, start_step: int = 0, max_steps: int = 6) -> RunInfo:
    cfg = Config()
    cfg.train.profile_steps, cfg.train.max_steps = profile_steps, max_steps
    return RunInfo(str(workdir), 0, True, "cpu", start_step, PLAN, cfg, precision="fp32", compile=False)


def step_metrics(step: int) -> StepMetrics:
    zero = {f.name: 0 for f in dataclasses.fields(StepMetrics)}
    return StepMetrics(**{**zero, "step": step, "skipped": False})


def train(run: RunInfo, stop_after: int | None = None) -> StepProfiler | None:
    """The trainer's events around one forward and backward of a small MLP per optimizer step, to ``run.end_step``
    (or ``stop_after``, then closed as a preempted run is)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    hooks = [p] if (p := step_profiler(run)) else []
    emit(hooks, Event.TRAIN_START, run)
    for step in range(run.start_step + 1, run.end_step + 1):
        model(torch.randn(8, 16)).square().mean().backward()
        emit(hooks, Event.STEP_END, run, step_metrics(step))
        if step == stop_after:
            break
    close(hooks, run)
    return p


def steps_in(trace: dict) -> list[int]:
    """The optimizer steps a chrome trace marks (``ProfilerStep#N``), in order."""
    names = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    return sorted(int(n.split("#")[1]) for n in names)


def test_a_window_records_exactly_its_steps_and_prints_the_top_operators(tmp_path, caplog):
    with caplog.at_level("INFO", logger="vitlarge"):
        train(make_run(tmp_path, "3-4"))
    files = sorted((tmp_path / PROFILE_DIRNAME).rglob("*"))
    assert [str(f.relative_to(tmp_path)) for f in files] == ["profile/steps3-4", "profile/steps3-4/rank0.pt.trace.json"]
    trace = json.loads(files[1].read_text())
    assert steps_in(trace) == [3, 4]  # not the warmup step 2, nor 5 and 6 after the window
    ops = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert {"aten::addmm", "aten::gelu"} <= ops
    text = caplog.text
    assert f"profile: optimizer steps 3-4 on every rank -> {tmp_path}/profile/steps3-4/rank<R>.pt.trace.json" in text
    assert "profile: top 10 operators of rank 0, steps 3-4" in text
    assert "Self CPU %" in text and "# of Calls" in text and "aten::addmm" in text  # key_averages().table
    assert text.count("Self CPU time total:") == 1  # one table: no CUDA here
    assert not torch.autograd._profiler_enabled()  # stopped once written


def test_traces_of_ranks_this_world_lacks_are_removed_by_rank_0(tmp_path):
    """An earlier attempt of the window on more ranks (killed before its checkpoint, requeued on fewer nodes)
    left rank1's trace: TensorBoard would show it beside this attempt's as one more worker."""
    folder = tmp_path / PROFILE_DIRNAME / "steps3-4"
    folder.mkdir(parents=True)
    (folder / "rank1.pt.trace.json").write_text("{}")
    (folder / "notes.txt").write_text("kept")
    train(make_run(tmp_path, "3-4"))
    assert sorted(f.name for f in folder.iterdir()) == ["notes.txt", "rank0.pt.trace.json"]


def test_an_incomplete_export_is_an_error_not_a_trace(tmp_path):
    """kineto returns without an error when its write fails (``export_chrome_trace('/dev/full')``): the export is
    checked to end its JSON document before it is renamed to the trace's name."""
    from vitlarge.train.profile import _check_complete

    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps({"traceEvents": [{"name": "aten::mm"}] * 100}) + "\n")
    _check_complete(whole)
    cut = tmp_path / "cut.json"
    cut.write_bytes(whole.read_bytes()[:-40])
    with pytest.raises(OSError, match="incomplete trace"):
        _check_complete(cut)


def test_a_window_at_the_runs_first_step_has_no_warmup(tmp_path):
    train(make_run(tmp_path, "1-2", max_steps=3))
    file = tmp_path / PROFILE_DIRNAME / "steps1-2" / "rank0.pt.trace.json"
    assert steps_in(json.loads(file.read_text())) == [1, 2]


def test_a_resumed_run_records_the_part_of_the_window_after_its_step(tmp_path):
    train(make_run(tmp_path, "2-5", start_step=3))
    (folder,) = (tmp_path / PROFILE_DIRNAME).iterdir()
    (file,) = folder.iterdir()
    assert (folder.name, file.name) == ("steps4-5", "rank0.pt.trace.json")
    assert steps_in(json.loads(file.read_text())) == [4, 5]


def test_a_window_done_before_the_resume_adds_no_profiler(tmp_path, caplog):
    with caplog.at_level("INFO", logger="vitlarge"):
        assert step_profiler(make_run(tmp_path, "2-5", start_step=5)) is None
    assert "profile: train.profile_steps=2-5 was done before this run resumed at step 5; nothing to profile" in (
        caplog.text
    )


def test_off_by_default_there_is_no_profiler(tmp_path):
    assert step_profiler(make_run(tmp_path, None)) is None


def test_a_run_stopped_inside_the_window_writes_no_trace(tmp_path):
    assert train(make_run(tmp_path, "3-5"), stop_after=4) is not None
    assert not (tmp_path / PROFILE_DIRNAME).exists()
    assert not torch.autograd._profiler_enabled()


def test_a_window_after_the_plans_last_step_is_one_line():
    cfg = Config()
    cfg.train.profile_steps = "655-665"
    with pytest.raises(UserError) as e:
        check_window(cfg, PLAN)
    assert str(e.value) == (
        "train.profile_steps=655-665 ends after step 660, the run's last (the schedule's 660 steps); "
        "end the window by step 660"
    )
    cfg.train.profile_steps = "655-660"
    check_window(cfg, PLAN)
    cfg.train.max_steps = 100
    with pytest.raises(UserError, match=r"ends after step 100, the run's last \(train.max_steps=100\)"):
        check_window(cfg, PLAN)


def test_a_profile_link_planted_in_the_workdir_is_not_written_through(tmp_path, caplog):
    """A handed-over workdir whose ``profile`` leads elsewhere: one warning, nothing written there, the run goes on."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / PROFILE_DIRNAME).symlink_to(elsewhere)
    with caplog.at_level("INFO", logger="vitlarge"):
        train(make_run(workdir, "1-1", max_steps=2))
    assert list(elsewhere.iterdir()) == []
    assert (
        f"warning: profile: could not write {workdir}/profile/steps1-1/rank0.pt.trace.json: leads outside"
        in caplog.text
    )
    assert "profile: top 10 operators of rank 0, steps 1-1" in caplog.text  # the table still comes
