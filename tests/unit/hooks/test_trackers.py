"""What the tracker hooks share, in process: the background sender (hooks/_sender.py) and one tracked run per
checkpoint line (hooks/_tracking.py, ``<workdir>/trackers.json``). The hooks against a real MLflow server and W&B's
offline mode, in real runs: tests/e2e/test_trackers.py."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time

import pytest

from hooks import _sender, _tracking
from hooks._sender import Sender
from tests.helpers.events import make_run, step_metrics
from vitlarge.config.schema import Config


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_full_queue_drops_and_counts_and_put_never_blocks(caplog):
    entered, release, sent = threading.Event(), threading.Event(), []

    def send(batch):
        entered.set()
        release.wait()
        sent.extend(batch)

    s = Sender("t", send, maxsize=5, what="a slow server")
    s.put(0)
    assert entered.wait(30)  # the thread holds record 0 in a send that does not return
    for i in range(1, 20):
        s.put(i)  # 5 fit, 14 are dropped: none of these calls waits for the send
    assert s.dropped == 14
    release.set()
    assert s.close(timeout=30) == 14
    assert sent == [0, 1, 2, 3, 4, 5]
    assert warnings_of(caplog) == ["warning: t: 14 records not sent to a slow server; metrics.jsonl has every step"]


def test_a_dead_tracker_is_one_warning_line_then_counts_never_an_exception(caplog):
    def send(batch):
        raise ConnectionError("[Errno 111] Connection refused")

    s = Sender("mlflow", send, what="http://127.0.0.1:9")
    for i in range(50):
        s.put(i)
    assert s.close(timeout=30) == 50
    first, last = warnings_of(caplog)
    assert first.startswith(
        "warning: mlflow: cannot send to http://127.0.0.1:9 (ConnectionError: [Errno 111] Connection refused); "
        "training goes on"
    )
    assert last == "warning: mlflow: 50 records not sent to http://127.0.0.1:9; metrics.jsonl has every step"


def test_while_sends_fail_a_line_counts_the_dropped_records_periodically(caplog):
    calls = threading.Semaphore(0)

    def send(batch):
        calls.release()
        raise TimeoutError("read timed out")

    s = Sender("wandb", send, report_every_s=0)  # every failure past the first reports the count
    for i in range(3):
        s.put(i)
        assert calls.acquire(timeout=30)  # one record per batch
    s.close(timeout=30)
    lines = warnings_of(caplog)
    assert lines[0].startswith("warning: wandb: cannot send to the tracker (TimeoutError: read timed out)")
    assert lines[1:3] == ["warning: wandb: 2 records not sent so far", "warning: wandb: 3 records not sent so far"]


def test_closing_waits_a_bounded_time_for_a_tracker_that_hangs_and_says_what_was_not_sent(caplog):
    release = threading.Event()
    s = Sender("mlflow", lambda batch: release.wait(), what="a hung server")
    for i in range(3):
        s.put(i)
    try:
        unsent = s.close(timeout=0.2)  # returns although the send never does
    finally:
        release.set()
    assert unsent == 3
    assert warnings_of(caplog) == [
        "warning: mlflow: 3 records not sent to a hung server (still sending when the wait ended); "
        "metrics.jsonl has every step"
    ]


def test_closing_waits_while_batches_keep_arriving_past_the_no_progress_window(monkeypatch, caplog):
    monkeypatch.setattr(_sender, "BATCH", 1)  # one record a batch: each delivered batch is progress
    sent = []

    def send(batch):
        time.sleep(0.1)
        sent.extend(batch)

    s = Sender("mlflow", send)
    for i in range(10):
        s.put(i)
    assert s.close(timeout=0.5) == 0  # 1 s of sending in all, never 0.5 s without a batch delivered
    assert sent == list(range(10)) and not warnings_of(caplog)


def test_a_send_that_raises_any_exception_never_kills_the_thread(caplog):
    calls = []

    def send(batch):
        calls.append(batch)
        if len(calls) == 1:
            raise SystemExit(3)  # a library calling sys.exit: not an Exception

    s = Sender("wandb", send, what="W&B")
    s.put(0)
    while not calls:
        time.sleep(0.01)
    s.put(1)
    assert s.close(timeout=30) == 1
    assert calls == [[0], [1]]
    first, last = warnings_of(caplog)
    assert first.startswith("warning: wandb: cannot send to W&B (SystemExit: 3)"), first
    assert last == "warning: wandb: 1 record not sent to W&B; metrics.jsonl has every step"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_records_left_behind_by_a_dead_thread_are_counted_as_not_sent(caplog):
    def send(batch):
        raise KeyboardInterrupt  # not caught: the thread ends

    s = Sender("mlflow", send, what="M")
    s.put(0)
    s._thread.join(30)
    assert not s._thread.is_alive()
    s.put(1)
    s.put(2)
    assert s.close(timeout=30) == 3
    assert warnings_of(caplog)[-1] == "warning: mlflow: 3 records not sent to M; metrics.jsonl has every step"


# One tracked run per checkpoint line.


def test_each_start_is_a_segment_of_the_lines_tracked_run(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    first = _tracking.begin(make_run(tmp_path), "mlflow")
    assert (first.run_id, first.parent_id, first.segment.number, first.segment.reason) == (None, None, 1, "start")
    assert first.segment.world_size == 4 and first.segment.start_step == 0
    _tracking.save_id(str(tmp_path), None, "mlflow", "0123456789abcdef0123456789abcdef")

    again = _tracking.begin(make_run(tmp_path, start_step=6), "mlflow")  # kill -9, rerun: resumes at step 6
    assert (again.run_id, again.segment.number, again.segment.reason) == (
        "0123456789abcdef0123456789abcdef",
        2,
        "resume",
    )
    assert again.token == first.token
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    requeued = _tracking.begin(make_run(tmp_path, start_step=8, world_size=2), "mlflow")  # fewer nodes
    assert (requeued.segment.number, requeued.segment.reason, requeued.segment.world_size) == (3, "requeue", 2)
    assert _tracking.begin(make_run(tmp_path), "mlflow").segment.reason == "restart"  # killed before a checkpoint
    assert _tracking.begin(make_run(tmp_path), "wandb").segment.number == 1  # each tracker counts its own


def test_segment_names_sort_in_start_order(tmp_path):
    names = []
    for _ in range(11):
        c = _tracking.begin(make_run(tmp_path), "mlflow")
        names.append(c.segment.name)
    assert names[:2] == ["001", "002"] and names[-1] == "011"
    assert sorted(names, key=str) == names  # as a tag or config key: segment 10 after 9, not after 1


def test_a_resume_of_an_older_step_starts_a_new_tracked_run_whose_parent_is_the_old_one(tmp_path):
    _tracking.begin(make_run(tmp_path), "mlflow")
    _tracking.save_id(str(tmp_path), None, "mlflow", "a" * 32)
    line = str(tmp_path / "checkpoints" / "step_0000004")  # --resume of step 4 of the line from scratch
    new = _tracking.begin(make_run(tmp_path, start_step=4, lineage=line, parent_lineage=None), "mlflow")
    assert (new.run_id, new.parent_id, new.segment.reason) == (None, "a" * 32, "resume-from")
    _tracking.save_id(str(tmp_path), line, "mlflow", "b" * 32)
    # The same --resume again (a requeue replays it): the new line's run continues, its parent kept.
    again = _tracking.begin(make_run(tmp_path, start_step=6, lineage=line, parent_lineage=line), "mlflow")
    assert (again.run_id, again.parent_id, again.segment.number) == ("b" * 32, "a" * 32, 2)
    saved = json.loads((tmp_path / "trackers.json").read_text())["lines"]
    assert saved[""]["mlflow"]["id"] == "a" * 32 and saved[line]["mlflow"]["id"] == "b" * 32


def test_a_resume_of_another_workdirs_checkpoint_names_no_parent(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    _tracking.begin(make_run(here), "mlflow")
    _tracking.save_id(str(here), None, "mlflow", "a" * 32)  # this workdir's line from scratch, not the one resumed
    line = str(there / "checkpoints" / "step_0000004")  # --resume of another workdir's step 4 (its line from scratch)
    new = _tracking.begin(make_run(here, start_step=4, lineage=line, parent_lineage=None), "mlflow")
    assert (new.run_id, new.parent_id, new.segment.reason) == (None, None, "resume-from")


def test_another_mlflow_store_starts_a_new_tracked_run(tmp_path):
    _tracking.begin(make_run(tmp_path), "mlflow", same_store={"uri": "sqlite:///a.db"})
    _tracking.save_id(str(tmp_path), None, "mlflow", "a" * 32)
    assert _tracking.begin(make_run(tmp_path, start_step=2), "mlflow", same_store={"uri": "sqlite:///a.db"}).run_id
    other = _tracking.begin(make_run(tmp_path, start_step=4), "mlflow", same_store={"uri": "http://h:5000"})
    assert (other.run_id, other.segment.number) == (None, 1)


@pytest.mark.parametrize(
    "content, why",
    [
        ("{not json", "is unreadable"),
        ('{"lines": []}', "holds no 'lines' map"),
        ('{"lines": {"": {"mlflow": {"id": "../../etc", "token": "' + "0" * 32 + '", "segments": 1}}}}', "malformed"),
        ('{"lines": {"": {"mlflow": {"id": null, "token": "x", "segments": 1}}}}', "malformed"),
        ('{"lines": {"": {"mlflow": {"id": null, "token": "' + "0" * 32 + '", "segments": -1}}}}', "malformed"),
    ],
)
def test_a_malformed_trackers_file_is_one_line_and_a_new_tracked_run(tmp_path, caplog, content, why):
    (tmp_path / "trackers.json").write_text(content)
    c = _tracking.begin(make_run(tmp_path, start_step=4), "mlflow")
    assert (c.run_id, c.segment.number) == (None, 1)
    (line,) = warnings_of(caplog)
    assert line.startswith(f"warning: {tmp_path / 'trackers.json'}") and why in line, line
    json.loads((tmp_path / "trackers.json").read_text())  # rewritten whole


def test_the_trackers_file_is_read_capped_and_a_planted_link_is_never_followed(tmp_path, caplog):
    outside = tmp_path / "outside.json"
    outside.write_text('{"lines": {}}')
    workdir = tmp_path / "w"
    workdir.mkdir()
    os.symlink(outside, workdir / "trackers.json")
    _tracking.begin(make_run(workdir), "mlflow")
    assert outside.read_text() == '{"lines": {}}'  # neither read through nor written through
    assert not (workdir / "trackers.json").is_symlink()
    assert "is unreadable" in warnings_of(caplog)[0]
    big = tmp_path / "big"
    big.mkdir()
    (big / "trackers.json").write_text(" " * (_tracking.STATE_MAX_BYTES + 1))
    assert _tracking.read_state(big) == {"lines": {}}


def test_every_resolved_config_key_is_a_parameter_cut_at_500_characters():
    cfg = Config()
    cfg.train.phases = [{"epoch": i, "image_size": 224} for i in range(40)]
    params = _tracking.flat_params(cfg.to_dict())
    from vitlarge.config.overrides import all_keys

    assert set(params) == set(all_keys(cfg))
    assert params["optim.betas"] == "[0.9, 0.999]" and params["workdir"] == "runs/default"
    assert params["log.mlflow"] == "false" and params["log.mlflow_uri"] == "null"
    assert len(params["train.phases"]) == 500 and params["train.phases"].endswith("...")


def test_the_commit_is_read_from_the_checkout_without_starting_git():
    assert re.fullmatch(r"[0-9a-f]{40}", _tracking.source_commit())


def test_wandb_rewinds_only_a_resume_that_replays_steps(tmp_path):
    from hooks.wandb import replays

    assert not replays(str(tmp_path), 6)  # no metrics.jsonl yet
    lines = [{"event": "start", "step": 0}] + [{"event": "train", "step": s} for s in range(1, 7)]
    lines += [{"event": "checkpoint", "step": 6}, {"event": "end", "step": 6}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert not replays(str(tmp_path), 6)  # stopped at its checkpoint: the resume logs new steps only
    with path.open("a") as f:  # resumed at 6, killed -9 after step 8 (and half a line)
        f.write(json.dumps({"event": "start", "step": 6}) + "\n")
        f.write("".join(json.dumps({"event": "train", "step": s}) + "\n" for s in (7, 8)) + '{"event": "tr')
    assert replays(str(tmp_path), 6)  # resumed at 6 again: steps 7 and 8 are replayed
    assert not replays(str(tmp_path), 8)


# A tracker that breaks at the start of a run (a broken install, an unwritable workdir) is one line, never a crash.


def _tracker_hooks():
    from hooks.mlflow import MlflowHook
    from hooks.wandb import WandbHook

    return [("mlflow", MlflowHook), ("wandb", WandbHook)]


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """``stand_in(name, source)``: a package ``name`` with that ``__init__`` shadows the installed one for this test.
    Afterwards every module of that name imported meanwhile is gone and the real ones are back: the xdist worker
    runs other files in this process next (the e2e tracker tests import the real MLflow here)."""
    saved: dict[str, dict] = {}

    def make(name: str, source: str) -> None:
        package = tmp_path / "site" / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        saved[name] = {m: sys.modules.pop(m) for m in list(sys.modules) if m == name or m.startswith(name + ".")}

    yield make
    for name, modules in saved.items():
        for m in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[m]
        sys.modules.update(modules)


@pytest.mark.parametrize("name, hook_cls", _tracker_hooks())
def test_a_tracker_that_is_installed_but_fails_to_import_is_one_line_and_training_goes_on(
    tmp_path, stand_in, caplog, name, hook_cls
):
    # what find_spec passes: the package is there, its import raises
    stand_in(name, "raise TypeError('Descriptors cannot be created directly.')\n")
    hook = hook_cls(str(tmp_path))
    run = make_run(tmp_path)
    hook.on_train_start(run)
    hook.on_step_end(run, step_metrics(1))
    hook.on_close(run)
    (line,) = warnings_of(caplog)
    assert line.startswith(f"warning: {name}: ") and "TypeError: Descriptors cannot be created directly." in line, line
    assert "training goes on without it" in line, line
    assert hook.sender is None


@pytest.mark.parametrize("name, hook_cls", _tracker_hooks())
def test_a_trackers_file_that_cannot_be_written_is_one_line_and_training_goes_on(
    tmp_path, stand_in, caplog, name, hook_cls
):
    (tmp_path / "trackers.json").mkdir()  # as a full disk or a read-only workdir: writing it raises OSError
    # The tracker is never reached (trackers.json is written before it starts): an empty package stands for it, so
    # this in-process test does not pay the real import (seconds, and a subprocess of MLflow's).
    stand_in(name, "")
    hook = hook_cls(str(tmp_path))
    run = make_run(tmp_path)
    hook.on_train_start(run)
    hook.on_step_end(run, step_metrics(1))
    hook.on_close(run)
    lines = [w for w in warnings_of(caplog) if w.startswith(f"warning: {name}: ")]
    assert len(lines) == 1 and "training goes on without it" in lines[0], warnings_of(caplog)
    assert hook.sender is None
