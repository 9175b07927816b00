"""The files a run writes in its workdir (metrics.jsonl, tb/, metrics.png) with links planted under their
names, as a handed-over workdir may hold: a target outside stays untouched; the run replaces the link
safely or stops with one line naming the file."""

from __future__ import annotations

import os

import pytest

from hooks import JsonlHook, TensorBoardHook
from hooks.jsonl import read_metrics
from tests.unit.hooks.test_hooks import EVAL, make_run, step_metrics
from vitlarge.errors import UserError
from vitlarge.report.plot import plot_run


@pytest.fixture
def workdir(tmp_path):
    w = tmp_path / "run"
    w.mkdir()
    return w


def test_metrics_jsonl_link_stops_the_run_with_one_line(workdir, victim):
    os.symlink(victim, workdir / "metrics.jsonl")
    hook = JsonlHook(str(workdir))
    with pytest.raises(UserError) as e:
        hook.on_train_start(make_run(workdir))
    assert str(e.value) == (
        f"{workdir / 'metrics.jsonl'}: is a symbolic link; vitlarge appends to only regular files; remove it "
        "(or put a copy of the file it stands for in its place) and run again"
    )
    hook.on_step_end(make_run(workdir), step_metrics(1))  # nothing open: nothing written anywhere
    assert victim.read_bytes() == b"precious"


def test_metrics_jsonl_fifo_stops_the_run_instead_of_hanging(workdir):
    os.mkfifo(workdir / "metrics.jsonl")
    with pytest.raises(UserError, match="metrics.jsonl: is a FIFO, not a regular file"):
        JsonlHook(str(workdir)).on_train_start(make_run(workdir))


def test_metrics_jsonl_still_appends_after_a_partial_line(workdir):
    (workdir / "metrics.jsonl").write_text('{"event": "train", "step": 1}\n{"event": "tr')
    hook = JsonlHook(str(workdir))
    hook.on_train_start(make_run(workdir, start_step=1))
    hook.on_step_end(make_run(workdir), step_metrics(2))
    hook.on_close(make_run(workdir))
    assert [r["event"] for r in read_metrics(str(workdir / "metrics.jsonl"))] == ["train", "start", "train"]


def test_tensorboard_folder_linked_outside_stops_the_run(workdir, victim):
    os.symlink(victim.parent, workdir / "tb")
    with pytest.raises(UserError) as e:
        TensorBoardHook(str(workdir)).on_train_start(make_run(workdir))
    assert str(e.value).startswith(f"{workdir / 'tb'}: leads outside {workdir} (to {victim.parent})")
    assert os.listdir(victim.parent) == ["victim"]


def test_metrics_png_and_its_tmp_linked_outside_are_replaced_not_written_through(workdir, victim, tmp_path):
    hook = JsonlHook(str(workdir))
    run = make_run(workdir)
    hook.on_train_start(run)
    for step in (1, 2, 3):
        hook.on_step_end(run, step_metrics(step))
    hook.on_eval_end(run, EVAL)
    hook.on_close(run)
    other = tmp_path / "outside" / "other"
    other.write_bytes(b"precious")
    os.symlink(victim, workdir / "metrics.png")
    os.symlink(other, workdir / "metrics.png.tmp")
    out = plot_run(workdir)
    assert victim.read_bytes() == b"precious" and other.read_bytes() == b"precious"
    assert not out.is_symlink() and out.read_bytes().startswith(b"\x89PNG")
