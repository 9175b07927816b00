"""The files a run writes in its workdir (metrics.jsonl, tb/, metrics.png) with links planted under their
names, as a handed-over workdir may hold: a target outside stays untouched; the run replaces the link
safely or stops with one line naming the file."""

from __future__ import annotations

import os

import pytest

from hooks import JsonlHook, TensorBoardHook
from hooks.jsonl import read_metrics
from tests.helpers.events import EVAL, make_run, step_metrics
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


# The trackers' files in the workdir: the MLflow store of a workdir (no log.mlflow_uri), W&B's folder.


@pytest.mark.parametrize(
    "tracker, name",
    [("mlflow", "mlflow.db"), ("mlflow", "mlflow.db-journal"), ("mlflow", "mlartifacts"), ("wandb", "wandb")],
)
def test_tracker_files_linked_outside_stop_the_run(workdir, victim, monkeypatch, tracker, name):
    """A handed-over workdir with ``mlflow.db -> elsewhere/victim.db`` made MLflow create the database there, and
    ``mlartifacts`` or ``wandb`` links took the model and W&B's offline run out: one line now, as for ``tb``."""
    from hooks import MlflowHook, WandbHook

    for var in ("MLFLOW_TRACKING_URI", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    target = victim.parent / "made_there" if name == "mlflow.db" else victim.parent
    os.symlink(target, workdir / name)
    hook = (MlflowHook if tracker == "mlflow" else WandbHook)(str(workdir))
    with pytest.raises(UserError) as e:
        hook.on_train_start(make_run(workdir))
    assert str(e.value) == (
        f"{workdir / name}: leads outside {workdir} (to {target}); vitlarge reads and writes only inside it; "
        "remove the link and run again"
    )
    assert hook.sender is None and os.listdir(victim.parent) == ["victim"]


def test_the_workdir_store_takes_no_artifact_location_from_its_database(workdir, tmp_path):
    """The location the workdir's mlflow.db records for a run's artifacts must be a folder of its mlartifacts:
    an edited database named ``file:///elsewhere`` or a server, and the trained weights went there."""
    from hooks.mlflow import MlflowHook, _Refused

    hook = MlflowHook(str(workdir))
    inside = workdir / "mlartifacts" / "0a1b" / "artifacts"
    hook._check_location(inside.as_uri())
    hook._check_location(str(inside))
    (workdir / "mlartifacts").mkdir()
    (workdir / "mlartifacts" / "planted").symlink_to(tmp_path)
    for where in (
        (tmp_path / "elsewhere").as_uri(),
        "http://127.0.0.1:8080/x/0a1b/artifacts",
        "s3://bucket/0a1b/artifacts",
        f"{(workdir / 'mlartifacts').as_uri()}/../../elsewhere",
        (workdir / "mlartifacts" / "planted" / "artifacts").as_uri(),
        (workdir / "model").as_uri(),
    ):
        with pytest.raises(_Refused) as e:
            hook._check_location(where)
        assert f"sends this run's artifacts to {where}, outside {workdir / 'mlartifacts'}" in str(e.value)
        assert "refused: this run is not tracked in MLflow, training goes on" in str(e.value)


def test_a_link_planted_in_the_runs_artifact_folder_is_never_written_through(workdir, victim, caplog):
    from hooks.mlflow import MlflowHook

    hook = MlflowHook(str(workdir))
    folder = workdir / "mlartifacts" / "0a1b" / "artifacts"
    hook.artifact_uri = folder.as_uri()
    assert hook._destination_safe()
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "model.safetensors").symlink_to(victim)
    assert not hook._destination_safe() and not hook._destination_safe()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"warning: mlflow: {folder / 'model' / 'model.safetensors'} is a link; this run's")
