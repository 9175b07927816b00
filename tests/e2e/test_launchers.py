"""train.py under the real launchers: what survives `colossalai run`'s unquoted ``bash -c``, Ctrl-C, and what a
failure looks like under torchrun.

* Overrides written without shell metacharacters (``optim.betas=0.9,0.98``, ``model.kwargs.depth=2``,
  ``train.phases.1.image_size=16``, ``--overrides FILE``) reach the run intact through ``make demo`` (with
  variables on make's command line) and ``colossalai run``; a
  ``--workdir`` with a space is one line saying why (the shell split it), not an unknown override.
* Ctrl-C (SIGINT to the launcher's process group, as a terminal sends it) checkpoints at the step in progress,
  says so once, and the launcher returns (``colossalai run`` 0.5.0 used to hang after "Aborted!").
* A bad override under torchrun: our line comes first and torchrun's summary repeats it (its error file).
* ``python -m vitlarge.run`` (torchrun's agent, our ending): a failure is the worker's line and one summary line,
  with the worker's status (2, 75 on a preemption signal, 130 on Ctrl-C); a busy --master_port is one line, exit 2.
* ``make demo`` takes a free port unless PORT is given.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers import ROOT, launcher
from vitlarge.report.metrics_log import read_metrics

RECIPE = "recipes/demo_digits.py"


def start_record(workdir) -> dict:
    records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in records if r["event"] == "start")["config"]


def test_overrides_without_metacharacters_survive_make_demo_and_colossalai_run(demo_data, tmp_path):
    """Through ``make demo`` with variables on make's command line (NPROC, PORT, WORKDIR, ARGS): any ``VAR=value``
    makes make export MAKEOVERRIDES, which colossalai run's unquoted ``bash -c`` cannot expand ("bad
    substitution"): the Makefile unexports it. The overrides reach the run intact, and the demo's summary follows."""
    extra = tmp_path / "extra.py"
    extra.write_text("augment.mixup_alpha = 0.0\nmodel.kwargs['num_heads'] = 2\n")
    args = [
        "--data",
        demo_data,
        "--overrides",
        str(extra),
        "optim.betas=0.9,0.98",
        "model.kwargs.depth=2",
        "model.kwargs.embed_dim=48",
        "train.phases.0.epoch=0",
        "train.phases.0.image_size=8",
        "train.phases.1.epoch=1",
        "train.phases.1.image_size=16",
        "train.phases.1.crop_scale=0.5,1",
        "train.phases.1.micro_batch=8",
        "train.compile=false",
        "train.max_steps=1",
        "train.eval_every_epochs=0",
    ]
    port, workdir = launcher.free_port(), tmp_path / "run"
    r = subprocess.run(
        make_demo("NPROC=1", f"PORT={port}", f"WORKDIR={workdir}", f"ARGS={' '.join(args)}"),
        cwd=ROOT,
        env=launcher.env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"colossalai run --nproc_per_node 1 --master_port {port}" in r.stdout
    assert "final validation top-1" in r.stdout and f"model: {workdir}/model" in r.stdout, r.stdout[-3000:]
    cfg = start_record(workdir)
    assert cfg["optim"]["betas"] == [0.9, 0.98] and cfg["train"]["compile"] == "off"
    assert cfg["model"]["kwargs"] == {"patch_size": 4, "embed_dim": 48, "depth": 2, "num_heads": 2}
    assert cfg["train"]["phases"] == [
        {"epoch": 0, "image_size": 8},
        {"epoch": 1, "image_size": 16, "crop_scale": [0.5, 1], "micro_batch": 8},  # as dicts, in the order set
    ]
    assert cfg["augment"]["mixup_alpha"] == 0.0


def test_a_workdir_with_a_space_is_one_line_under_colossalai_run(demo_data, tmp_path):
    r = launcher.run(
        ["--config", RECIPE, "--data", demo_data, "--workdir", str(tmp_path / "my run"), "--dry-run"],
        nproc=1,
        launcher="colossalai",
    )
    out = r.stdout + r.stderr
    errors = [x for x in out.splitlines() if x.startswith("error: ")]
    assert errors == [
        "error: command line: argument 'run' has no '=': colossalai run passes the arguments through bash unquoted, "
        "which splits a path or value at its spaces; use a path without spaces, or start with torchrun or srun, "
        "which keep them"
    ], out[-3000:]
    assert r.returncode != 0


def test_a_bad_override_under_torchrun_comes_first_and_is_its_summary(tmp_path):
    r = launcher.run(["--config", RECIPE, "--dry-run", "train.micro_batch=abc"], nproc=2, launcher="torchrun")
    line = "error: command line: 'train.micro_batch=abc' is not an int; write it like train.micro_batch=256"
    lines = r.stderr.splitlines()
    assert r.returncode == 1  # torchrun's status for any failure (docs/CLUSTERS.md)
    assert lines.count(line) == 1, r.stderr[-3000:]
    assert lines.index(line) < next(i for i, x in enumerate(lines) if x.startswith("Traceback"))
    assert f"traceback : {line}" in r.stderr  # the summary repeats it, not "To enable traceback see: ..."


def test_a_bad_override_under_vitlarge_run_is_the_line_a_summary_and_status_2():
    r = launcher.run(["--config", RECIPE, "--dry-run", "train.micro_batch=abc"], nproc=2, launcher="vitlarge")
    line = "error: command line: 'train.micro_batch=abc' is not an int; write it like train.micro_batch=256"
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    assert len(lines) == 2 and lines[0] == line, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.fullmatch(r"vitlarge\.run: rank [01] exited with status 2: " + re.escape(line), lines[1]), lines
    assert r.returncode == 2


def test_a_busy_master_port_under_vitlarge_run_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = launcher.run(["--config", RECIPE, "--dry-run"], nproc=2, launcher="vitlarge", port=port)
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    assert len(lines) == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.fullmatch(
        rf"error: --master_port {port} is in use on this machine \(another run\?\): give this run another port, "
        r"e\.g\. --master_port \d+",
        lines[0],
    ), lines
    assert r.returncode == 2


@pytest.mark.parametrize("how", ["SIGUSR1 to one worker", "SIGTERM to every process"])
def test_a_preempted_run_under_vitlarge_run_exits_75(how, demo_data, tmp_path):
    """SIGUSR1 to one worker: it and the other (told through the step's all-reduce) checkpoint and exit 75, and the
    launcher reports the first's. SIGTERM to every process, as Slurm preempts a step: the launcher has the signal
    too (torchrun raises in its agent), and reads the workers' statuses from their error files."""
    workdir, log = tmp_path / "run", tmp_path / "run.log"
    args = ["--config", RECIPE, "--data", demo_data, "--workdir", str(workdir), "train.log_every_steps=1"]
    args += ["train.max_steps=200", "train.checkpoint_every_steps=0", "train.eval_every_epochs=0"]
    proc = launcher.start(args, nproc=2, launcher="vitlarge", log=log)
    try:
        metrics = workdir / "metrics.jsonl"
        seen = lambda: metrics.exists() and '"step": 2' in metrics.read_text()  # noqa: E731
        assert launcher.wait_for(seen, timeout=300, proc=proc), log.read_text()[-3000:]
        workers = psutil.Process(proc.pid).children()  # the agent's own children (not their data read workers)
        assert len(workers) == 2, workers
        if how == "SIGUSR1 to one worker":
            workers[1].send_signal(signal.SIGUSR1)
        else:
            for p in [proc, *workers]:
                os.kill(p.pid, signal.SIGTERM)
        status = proc.wait(timeout=300)
    finally:
        launcher.kill_tree(proc.pid)
    text = log.read_text()
    stops = [x for x in text.splitlines() if x.startswith("vitlarge: stopped on signal after step ")]
    assert len(stops) == 1, text[-3000:]
    assert "Traceback" not in text and "ChildFailedError" not in text
    assert status == 75, text[-3000:]
    summaries = [x for x in text.splitlines() if x.startswith("vitlarge.run: ")]
    if how == "SIGUSR1 to one worker":
        assert len(summaries) == 1 and re.fullmatch(
            r"vitlarge\.run: rank [01] exited with status 75: " + re.escape(stops[0]), summaries[0]
        ), summaries
    else:  # the launcher was signalled: the workers' own lines say it all
        assert summaries == []


@pytest.mark.parametrize("how", ["colossalai", "torchrun", "vitlarge"])
def test_ctrl_c_checkpoints_the_step_in_progress_and_the_launcher_returns(how, demo_data, tmp_path):
    workdir, log = tmp_path / "run", tmp_path / "run.log"
    args = ["--config", RECIPE, "--data", demo_data, "--workdir", str(workdir), "train.log_every_steps=1"]
    args += ["train.max_steps=200", "train.checkpoint_every_steps=0", "train.eval_every_epochs=0"]
    proc = launcher.start(args, nproc=2, launcher=how, log=log)  # a session of its own: its group is ours to signal
    try:
        metrics = workdir / "metrics.jsonl"
        seen = lambda: metrics.exists() and '"step": 3' in metrics.read_text()  # noqa: E731
        assert launcher.wait_for(seen, timeout=300, proc=proc), log.read_text()[-3000:]
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        status = proc.wait(timeout=300)  # a hang guard only: before the fix colossalai run never returned
    finally:
        launcher.kill_tree(proc.pid)
    text = log.read_text()
    stops = [x for x in text.splitlines() if x.startswith("vitlarge: interrupted (Ctrl-C) after step ")]
    assert len(stops) == 1, text[-3000:]
    assert text.count("vitlarge: Ctrl-C: saving a checkpoint at the end of this step") == 1
    step = int(stops[0].split("after step ")[1].split(";")[0])
    assert step >= 3 and (workdir / "checkpoints" / f"step_{step:07d}" / "meta.json").is_file()
    assert "KeyboardInterrupt" not in text
    if how == "vitlarge":  # the workers' own status, and none of torchrun's SignalException traceback
        assert status == 130 and "Traceback" not in text and "SignalException" not in text, text[-3000:]
        assert "death signal" not in text  # torchrun's agent log (W... Received 2 death signal, ...) left out
    else:  # both launchers report an interrupted run as 1; srun and python keep 130 (docs/CLUSTERS.md)
        assert status == 1


def test_sigterm_to_colossalai_runs_group_records_and_says_the_checkpoint_after_it_returned(demo_data, tmp_path):
    """SIGTERM to ``colossalai run``'s process group (``kill -- -PGID``, ``timeout``, a supervisor): Colossal-AI 0.5.0's
    launcher has no handler and returns 143 at once (the limit, docs/CLUSTERS.md); torchrun passes the signal to the
    workers, which checkpoint at the end of the step, record it in metrics.jsonl and say so on the launcher's own
    stream, and are gone seconds later. Rich's console ended rank 0 with status 1 at the next line once the
    launcher's pipes had no reader: no checkpoint record, no line."""
    workdir, log = tmp_path / "run", tmp_path / "run.log"
    args = ["--config", RECIPE, "--data", demo_data, "--workdir", str(workdir), "train.log_every_steps=1"]
    args += ["train.max_steps=200", "train.checkpoint_every_steps=0", "train.eval_every_epochs=0"]
    proc = launcher.start(args, nproc=2, launcher="colossalai", log=log)  # a session of its own: its group is ours
    try:
        metrics = workdir / "metrics.jsonl"
        seen = lambda: metrics.exists() and '"step": 3' in metrics.read_text()  # noqa: E731
        assert launcher.wait_for(seen, timeout=300, proc=proc), log.read_text()[-3000:]
        tree = launcher.tree(proc)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM  # a shell's 143: returned before its workers
        _, alive = psutil.wait_procs(tree, timeout=120)
        assert alive == [], alive  # torchrun and the workers end once the checkpoint is written
    finally:
        launcher.kill_tree(proc.pid)
    text = log.read_text()
    stops = [x for x in text.splitlines() if x.startswith("vitlarge: stopped on signal after step ")]
    assert len(stops) == 1, text[-3000:]
    assert stops[0].endswith(
        "(after colossalai run had returned 143: it does not wait for its workers on a SIGTERM; "
        "python -m vitlarge.run, torchrun and srun do)"
    )
    step = int(stops[0].split("after step ")[1].split(";")[0])
    path = workdir / "checkpoints" / f"step_{step:07d}"
    assert step >= 3 and (path / "meta.json").is_file()
    recorded = [m for m in read_metrics(str(metrics)) if m["event"] == "checkpoint"]
    assert [(m["step"], m["path"]) for m in recorded] == [(step, str(path))]


def test_the_second_ctrl_c_ends_a_worker_at_once(demo_data, tmp_path):
    """One process, no launcher (its own status is visible): the first Ctrl-C starts the checkpoint, the second
    ends the process by SIGINT's default action, without a traceback."""
    workdir, log = tmp_path / "run", tmp_path / "run.log"
    args = ["--config", RECIPE, "--data", demo_data, "--workdir", str(workdir), "train.log_every_steps=1"]
    args += ["train.max_steps=200", "train.checkpoint_every_steps=0", "train.eval_every_epochs=0"]
    # 64 micro-steps a step (~2 s on 2 cores, longer under load): the second Ctrl-C lands inside the step the
    # first one interrupted, not after its checkpoint (a 0.5 s step raced the poll on a loaded machine).
    args += ["train.global_batch=1024"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            launcher.command(args, 1, "python"),
            cwd=ROOT,
            env=launcher.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        metrics = workdir / "metrics.jsonl"
        assert launcher.wait_for(lambda: metrics.exists() and '"step": 2' in metrics.read_text(), 300, proc)
        os.killpg(proc.pid, signal.SIGINT)
        # The second comes within a poll of the first's message, long before the step and its checkpoint end.
        assert launcher.wait_for(lambda: "Ctrl-C again leaves without it" in log.read_text(), 300, proc)
        os.killpg(proc.pid, signal.SIGINT)
        status = proc.wait(timeout=300)
    finally:
        launcher.kill_tree(proc.pid)
    text = log.read_text()
    assert status == -signal.SIGINT, text[-3000:]
    assert "Traceback" not in text


def make_demo(*variables: str) -> list[str]:
    """``make demo`` in the checkout with this interpreter's venv as it is: its install and the demo data are taken
    as made (``-o``: never rebuilt, nothing written into the checkout)."""
    venv = Path(sys.executable).parent.parent
    stack = next((p.name.split("-", 1)[1] for p in venv.glob(".installed-*")), "cuda12")
    return [
        "make",
        "-o",
        f"{venv}/.installed-{stack}",
        "-o",
        "data/digits/dataset.json",
        "demo",
        f"VENV={venv}",
        *variables,
    ]


def test_make_demo_takes_a_free_port_unless_told_one():
    ports = set()
    for _ in range(2):
        dry = subprocess.run(make_demo("-n"), cwd=ROOT, env=launcher.env(), capture_output=True, text=True)
        ports |= set(re.findall(r"--master_port (\d+)", dry.stdout))
    assert len(ports) == 2 and "29500" not in ports, ports
    dry = subprocess.run(make_demo("-n", "PORT=29611"), cwd=ROOT, env=launcher.env(), capture_output=True, text=True)
    assert "--master_port 29611 " in dry.stdout, dry.stdout
