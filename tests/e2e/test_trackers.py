"""Experiment trackers in real runs (issue 33): a real ``mlflow server`` (SQLite backend, a loopback port) and W&B's
offline mode, read back with MlflowClient and W&B's own record schema (tests/helpers/wandb_offline.py).

Cheap by design: one 2-rank demo line killed -9 after step 7 and rerun asks every question about one tracked run
(parameters, each step's metrics against metrics.jsonl, segments, artifacts, the W&B run and its rewind); one run
whose server (its own) is stopped mid-run asks the failure questions (exit 0, bitwise the reference run's weights, one
warning line); the default SQLite store, a run the store lost, a ``--resume`` of an older step (the parent tag) and a
closed port are the real hook driven in this process (no training run).
In-process parts (the sender, trackers.json, the config checks): tests/unit/hooks/test_trackers.py.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from hooks import _tracking
from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.runs import (
    assert_bitwise_equal,
    final_weights,
    metrics_has_step,
    raw_metrics,
    reference_run,
    resumed_at,
    train_args,
)
from tests.helpers.wandb_offline import read_run
from vitlarge.model.precision import choose_precision

TIMEOUT = 600
WARN_MLFLOW = "warning: mlflow: "


class MlflowServer:
    """``mlflow server`` on a free loopback port with an SQLite backend and proxied artifacts, in its own session."""

    def __init__(self, root: Path):
        self.port = launcher.free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in launcher.env().items() if k != "PYTHONWARNINGS"}  # a dependency's own process
        self.log = root / "server.log"
        self.proc = subprocess.Popen(
            [f"{launcher.VENV_BIN}/mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port)]
            + ["--backend-store-uri", f"sqlite:///{root}/server.db", "--artifacts-destination", str(root / "art")]
            + ["--workers", "1"],
            cwd=root,
            env=env,
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert launcher.wait_for(self.healthy, TIMEOUT, self.proc, poll=0.2), self.log.read_text()[-3000:]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the server and its uvicorn worker
            self.proc.wait(60)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    yield server
    server.stop()


def wandb_env(root: Path) -> dict:
    """W&B offline, every file under ``root``: no network, nothing in the home folder."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        **{f"WANDB_{k}_DIR": str(root / k.lower()) for k in ("CACHE", "CONFIG", "DATA", "ARTIFACT")},
        "WANDB_DIR": str(root),
    }


def tracker_ids(workdir: Path, line: str = "") -> dict:
    return {t: e["id"] for t, e in json.loads((workdir / "trackers.json").read_text())["lines"][line].items()}


def mlflow_has_step(client, workdir: Path, step: int):
    def seen() -> bool:
        try:
            rid = tracker_ids(workdir).get("mlflow")
            return bool(rid) and any(m.step == step for m in client.get_metric_history(rid, "train_loss"))
        except Exception:  # noqa: BLE001 (not written yet)
            return False

    return seen


def by_step(history) -> dict[int, list]:
    """MLflow's metric history grouped by step, oldest first."""
    out = defaultdict(list)
    for m in sorted(history, key=lambda m: m.timestamp):
        out[m.step].append(m)
    return out


def numeric(record: dict) -> dict:
    """What the hooks log of a metrics.jsonl record: its numeric fields but the line's own ``time``."""
    return {k: v for k, v in _tracking.numbers(record).items() if k != "time"}


def test_a_line_killed_9_and_rerun_is_one_mlflow_run_and_one_wandb_run(demo_data, mlflow_server, tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    workdir = tmp_path / "run"
    # The server on a loaded machine can take past the hook's 10 s request timeout: this test asks about the history,
    # not about a slow server (the next test's), so a request may take its time.
    env = {**wandb_env(tmp_path / "wandb"), "MLFLOW_HTTP_REQUEST_TIMEOUT": "300"}
    trackers = ("log.mlflow=true", f"log.mlflow_uri={mlflow_server.uri}", "log.wandb=true")
    # Checkpoints at 6 and 12 only: the rerun resumes at 6 and replays what the killed attempt logged after it.
    args = train_args(demo_data, workdir, *trackers, "train.checkpoint_every_steps=6")

    first = tmp_path / "attempt_1.log"
    proc = launcher.start(args, nproc=2, launcher="fork", log=first, extra_env=env)
    try:
        assert launcher.wait_for(metrics_has_step(workdir, 7), TIMEOUT, proc), first.read_text()[-3000:]
        # Rank 1 stopped: rank 0 waits in its next collective (at step 8 at most) while its sender goes on, so the
        # kill comes once MLflow holds every step the attempt logged, whatever the tracker's lag.
        os.kill(proc.ranks[1].pid, signal.SIGSTOP)
        last = max(m["step"] for m in raw_metrics(workdir) if m["event"] == "train")
        assert last in (7, 8) and proc.poll() is None
        assert launcher.wait_for(mlflow_has_step(client, workdir, last), TIMEOUT, proc, poll=0.1), first.read_text()[
            -3000:
        ]
    finally:
        launcher.kill_tree(proc)
    r = launcher.run(args, nproc=2, timeout=TIMEOUT, extra_env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert resumed_at(out) == [(str(workdir / "checkpoints" / "step_0000006"), 6)]
    for text in (first.read_text(), out):
        assert "warning: mlflow" not in text and "warning: wandb" not in text, text[-3000:]

    records = read_metrics(str(workdir / "metrics.jsonl"))
    train = {m["step"]: m for m in records if m["event"] == "train"}
    evals = [m for m in records if m["event"] == "eval"]
    assert sorted(train) == list(range(1, 13))
    ids = tracker_ids(workdir)

    # MLflow: one run, every parameter, each step as metrics.jsonl has it (the latest value per step).
    exp = client.get_experiment_by_name("demo_digits")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_id == ids["mlflow"] and run.info.status == "FINISHED"
    start_config = [m for m in records if m["event"] == "start"][-1]["config"]
    assert run.data.params == _tracking.flat_params(start_config)
    expected = defaultdict(dict)  # metric -> step -> value
    for step, m in train.items():
        for k, v in numeric(m).items():
            expected[k][step] = v
    for m in evals:
        for k, v in numeric(m).items():
            expected[k][m["step"]] = v
    assert {"train_loss", "lr", "grad_norm", "loss_scale", "images_per_s", "data_time", "peak_mem_bytes"} <= set(
        expected
    ) and {"val_top1", "val_top5", "val_loss"} <= set(expected)
    for key, steps in expected.items():
        history = by_step(client.get_metric_history(run.info.run_id, key))
        assert {s: h[-1].value for s, h in history.items()} == steps, key
    replayed = by_step(client.get_metric_history(run.info.run_id, "train_loss"))
    assert [len(replayed[s]) for s in range(1, 7)] == [1] * 6  # logged by the first attempt only
    # Steps 7..last twice: the killed attempt's and the rerun's (the later one), then once.
    assert [len(replayed[s]) for s in range(7, 13)] == [2] * (last - 6) + [1] * (12 - last)
    segments = {k: json.loads(v) for k, v in run.data.tags.items() if k.startswith("vitlarge.segment.")}
    assert [(s["start_step"], s["world_size"], s["reason"]) for _, s in sorted(segments.items())] == [
        (0, 2, "start"),
        (6, 2, "resume"),
    ]
    tags = run.data.tags
    assert tags["vitlarge.commit"] == _tracking.source_commit() and tags["vitlarge.world_size"] == "2"
    # precision auto on this CPU: fp16 with AVX512-FP16, bf16 with AMX-BF16, else fp32 (choose_precision)
    auto = choose_precision("auto", torch.device("cpu"))[0]
    assert (tags["vitlarge.device"], tags["vitlarge.precision"], tags["vitlarge.plugin"]) == ("cpu", auto, "ddp")
    assert tags["vitlarge.precision_reason"].startswith(f"precision auto -> {auto}")
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"model", "metrics.png"}
    assert {a.path for a in client.list_artifacts(run.info.run_id, "model")} == {
        "model/config.json",
        "model/model.safetensors",
    }
    got = client.download_artifacts(run.info.run_id, "model/model.safetensors", str(tmp_path))
    assert Path(got).read_bytes() == (workdir / "model" / "model.safetensors").read_bytes()

    excerpt = {k: run.data.params[k] for k in ("train.global_batch", "optim.lr", "train.max_steps", "log.experiment")}
    print(f"\nMLflow run {run.info.run_id}: {len(run.data.params)} params, e.g. {excerpt}")
    print("train_loss (step, value, ms):", [(m.step, m.value, m.timestamp) for s in (6, 7, 8, 9) for m in replayed[s]])
    print("segments:", [segments[k] for k in sorted(segments)])
    # W&B offline: the rerun continued the same run id, rewound to the resumed step. (wandb-core writes its file in
    # blocks: a kill -9 of the job, wandb-core with it, may leave none of the killed attempt's records on disk.)
    dirs = sorted((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    assert [d.name.rsplit("-", 1)[1] for d in dirs] == [ids["wandb"]] * 2
    killed, resumed = (read_run(d) for d in dirs)
    assert killed["id"] in (None, ids["wandb"]) and resumed["id"] == ids["wandb"]
    assert resumed["config"]["_wandb"]["branch_point"] == {"run_id": ids["wandb"], "step": 6}
    assert resumed["config"]["segment_002"]["reason"] == "resume"
    assert {row["_step"]: row["train_loss"] for row in resumed["history"] if "train_loss" in row} == {
        s: v for s, v in expected["train_loss"].items() if s > 6
    }


def test_a_tracker_that_goes_down_mid_run_costs_one_line_and_not_a_bit_of_the_run(
    demo_data, tmp_path_factory, tmp_path
):
    from mlflow import MlflowClient

    ref = reference_run(demo_data, tmp_path_factory)  # the same command without trackers (shared by the session)
    # A server of its own: the one this test stops is no other test's, whatever the order.
    mlflow_server = MlflowServer(tmp_path_factory.mktemp("stopped_server"))
    client = MlflowClient(mlflow_server.uri)
    workdir = tmp_path / "run"
    log = tmp_path / "run.log"
    trackers = ("log.mlflow=true", f"log.mlflow_uri={mlflow_server.uri}", "log.wandb=true")
    args = train_args(demo_data, workdir, *trackers)
    proc = launcher.start(args, nproc=2, launcher="fork", log=log, extra_env=wandb_env(tmp_path / "wandb"))
    try:
        assert launcher.wait_for(mlflow_has_step(client, workdir, 3), TIMEOUT, proc, poll=0.1), log.read_text()[-3000:]
        mlflow_server.stop()
        assert proc.wait(TIMEOUT) == 0, log.read_text()[-3000:]
    finally:
        launcher.kill_tree(proc)
        mlflow_server.stop()
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.startswith(WARN_MLFLOW)]  # the hook's own lines
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{WARN_MLFLOW}cannot send to {mlflow_server.uri} ("), lines
    assert lines[1].startswith(WARN_MLFLOW) and "records not sent" in lines[1], lines
    assert "warning: wandb" not in text and "Traceback" not in text, text[-3000:]
    assert_bitwise_equal(final_weights(ref), final_weights(workdir))
    step_times = {
        name: sorted(m["step_time"] for m in read_metrics(str(w / "metrics.jsonl")) if m["event"] == "train")[6]
        for name, w in (("untracked (reference)", ref), ("tracked, server stopped after step 3", workdir))
    }
    print(f"\n{lines[0][:160]}...\n{lines[1]}\nmedian step time (s, not asserted: shared CPU): {step_times}")

    # The same run in W&B (offline, uninterrupted): every step and the final evaluation as metrics.jsonl has them,
    # the resolved config.
    records = read_metrics(str(workdir / "metrics.jsonl"))
    (run_dir,) = (tmp_path / "wandb" / "wandb").glob("offline-run-*")
    w = read_run(run_dir)
    assert w["id"] == tracker_ids(workdir)["wandb"]
    rows = defaultdict(dict)
    for row in w["history"]:
        rows[row["_step"]].update(row)
    for m in records:
        if m["event"] in ("train", "eval"):
            assert {k: rows[m["step"]][k] for k in numeric(m)} == numeric(m), m["step"]
    start_config = records[0]["config"]
    assert {k: w["config"][k] for k in start_config} == start_config
    assert w["config"]["segment_001"]["reason"] == "start" and w["config"]["vitlarge"]["world_size"] == 2


def drive(hook, run, steps: int = 3) -> None:
    """The events of a short run, as the trainer emits them."""
    from tests.helpers.events import EVAL, step_metrics

    hook.on_train_start(run)
    for s in range(1, steps + 1):
        hook.on_step_end(run, step_metrics(s))
    hook.on_eval_end(run, EVAL)
    hook.on_train_end(run, EVAL)
    export = Path(run.workdir) / "model"
    export.mkdir(exist_ok=True)
    (export / "config.json").write_text("{}")
    hook.on_export(run, str(export))
    hook.on_close(run)


class Sink:
    """A local HTTP server that answers every request and records it: where a database's artifact location may
    point (an MLflow server's artifact proxy takes ``PUT``)."""

    def __init__(self):
        import http.server
        import threading

        requests = self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PUT(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                requests.append(f"{self.command} {self.path}")
                self.send_response(200)
                self.end_headers()

            do_POST = do_GET = do_PUT

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_port}/x"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def handed_over(workdir: Path, to: Path, experiment: str, location: str) -> Path:
    """A copy of ``workdir`` (without its trackers.json: its next run is a new tracked run) whose mlflow.db gives
    ``experiment`` the artifact location ``location``, as an edited database would."""
    import shutil
    import sqlite3

    shutil.copytree(workdir, to, ignore=shutil.ignore_patterns("trackers.json"))
    db = sqlite3.connect(to / "mlflow.db")
    db.execute("UPDATE experiments SET artifact_location = ? WHERE name = ?", (location, experiment))
    db.commit()
    db.close()
    return to


def hook_lines(caplog) -> list[str]:
    """The MLflow hook's own warning lines (MLflow's and others' left out)."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(WARN_MLFLOW)]


def start_lines(caplog) -> list[str]:
    """The MLflow hook's line at a run's start."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("mlflow: run ")]


def test_the_default_store_a_lost_run_a_parent_and_a_closed_port(tmp_path, monkeypatch, caplog):
    """The real hook in this process (no training run: the run's side is the stopped server's test above): the
    default SQLite store in the workdir, its start line and its Default experiment's artifacts in the workdir; a saved
    run the store no longer has; a --resume of an older step (the parent tag); a copy of the workdir whose database
    sends artifacts elsewhere (a folder, a server: refused in one line, nothing written or sent there; the same
    database named by log.mlflow_uri: its location, named); a closed port (one line)."""
    from mlflow import MlflowClient

    from hooks import MlflowHook
    from tests.helpers.events import make_run
    from vitlarge.config.schema import Config

    def hook(workdir: Path) -> MlflowHook:
        # The default store's first start (its schema migrations) takes seconds; a loaded machine must not run out.
        return MlflowHook(str(workdir), flush_timeout_s=300)

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    caplog.set_level(logging.INFO, logger="vitlarge")
    cfg = Config()
    cfg.log.mlflow, cfg.log.experiment = True, "trackers-e2e"
    workdir = tmp_path / "default"
    workdir.mkdir()
    drive(hook(workdir), make_run(workdir, cfg=cfg))
    assert not hook_lines(caplog)
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name("trackers-e2e").experiment_id
    (found,) = client.search_runs([exp_id])
    first = found.info.run_id
    assert first == tracker_ids(workdir)["mlflow"]
    assert start_lines(caplog) == [
        f"mlflow: run {first} (experiment trackers-e2e) in sqlite:///{workdir / 'mlflow.db'}; artifacts to "
        f"{(workdir / 'mlartifacts').as_uri()}/{first}/artifacts"
    ]
    assert client.get_experiment("0").artifact_location == (workdir / "mlartifacts" / "0").as_uri()
    assert [m.value for m in client.get_metric_history(first, "train_loss")] == [6.9, 6.8, 6.7]
    assert (workdir / "mlartifacts" / first / "artifacts" / "model" / "config.json").is_file()

    # The line's run deleted in the store: the next start makes a new run for the line, and says so.
    client.delete_run(first)
    drive(hook(workdir), make_run(workdir, cfg=cfg, start_step=3))
    (line,) = hook_lines(caplog)
    second = tracker_ids(workdir)["mlflow"]
    assert second != first
    assert line == (
        f"{WARN_MLFLOW}run {first} of this line is not in sqlite:///{workdir / 'mlflow.db'} (deleted, or another "
        f"store under the same URI); run {second} continues the line (tag vitlarge.lost_run)"
    )
    tags = client.get_run(second).data.tags
    assert tags["vitlarge.lost_run"] == first
    assert json.loads(tags["vitlarge.segment.002"])["reason"] == "lost" and "vitlarge.segment.001" not in tags
    assert client.get_run(second).data.params["log.experiment"] == "trackers-e2e"

    # --resume of this workdir's step 2: a new tracked run whose parent is the line's.
    older = str(workdir / "checkpoints" / "step_0000002")
    drive(hook(workdir), make_run(workdir, cfg=cfg, start_step=2, lineage=older, parent_lineage=None))
    child = client.get_run(tracker_ids(workdir, older)["mlflow"])
    assert child.data.tags["mlflow.parentRunId"] == second
    assert child.info.run_name == "default-from-step-2"
    assert json.loads(child.data.tags["vitlarge.segment.001"])["reason"] == "resume-from"
    assert len(hook_lines(caplog)) == 1

    # Copies of this workdir whose database gives the experiment a location elsewhere: nothing goes there.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sink = Sink()
    try:
        for i, location in enumerate((elsewhere.as_uri(), sink.uri)):
            caplog.clear()
            handed = handed_over(workdir, tmp_path / f"handed{i}", "trackers-e2e", location)
            drive(hook(handed), make_run(handed, cfg=cfg))
            (line,) = hook_lines(caplog)
            assert line.startswith(f"{WARN_MLFLOW}{handed / 'mlflow.db'} sends this run's artifacts to {location},")
            assert line.endswith(
                f", outside {handed / 'mlartifacts'} (a workdir moved, or its database edited); refused: this run is "
                "not tracked in MLflow, training goes on; move mlflow.db aside to start a new store here, or name "
                "the store in log.mlflow_uri to use that location"
            )
            assert start_lines(caplog) == []
    finally:
        sink.stop()
    assert list(elsewhere.iterdir()) == [] and sink.requests == []
    # The user names that database: its location is theirs to choose, and the start line names it.
    caplog.clear()
    cfg.log.mlflow_uri = f"sqlite:///{tmp_path / 'handed0' / 'mlflow.db'}"
    drive(hook(tmp_path / "handed0"), make_run(tmp_path / "handed0", cfg=cfg))
    (line,) = start_lines(caplog)
    assert line.endswith(f"; artifacts to {elsewhere.as_uri()}/{line.split()[2]}/artifacts") and not hook_lines(caplog)
    assert (elsewhere / line.split()[2] / "artifacts" / "model" / "config.json").is_file()

    caplog.clear()
    closed = launcher.free_port()  # nothing listens there
    cfg.log.mlflow_uri = f"http://127.0.0.1:{closed}"
    workdir = tmp_path / "closed"
    workdir.mkdir()
    drive(MlflowHook(str(workdir)), make_run(workdir, cfg=cfg), steps=12)
    lines = hook_lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{WARN_MLFLOW}cannot send to http://127.0.0.1:{closed} (")
    assert lines[1].startswith(WARN_MLFLOW) and "records not sent" in lines[1]
