"""Slurm for real: srun and sbatch launching train.py on a single-node cluster running on this machine.

The ``slurm`` fixture brings the cluster up with scripts/slurm/local_cluster.sh (installs the Debian
packages if needed, starts munged, slurmctld and slurmd; reuses a healthy running cluster) and stops,
by PID, only the daemons it started. It needs root and apt-get; without them the tests skip, except
under CI=true, where they fail: CI must exercise the cluster path.

What is covered: world size and rank from SLURM_* under `srun -n 2` (24 steps, also the reference
run); demo_cpu.sbatch through `sbatch --wait`; the preemption path of scripts/slurm/requeue.sh in one
job stopped twice, by USR1 to the batch shell (the time-limit warning) and by an outside
`scontrol requeue` (TERM to every process of the job, as preemption does): checkpoint, exit 75,
requeue, resume, final weights bitwise equal to the srun reference (same world size, same code
path); and bad input (a missing task, a batch shell without srun, a checkpoint of another recipe).

The demo ViT runs 2 tasks on the 2-CPU node. ``srun -O`` (overcommit) lets steps start whatever
the CPU count.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import launcher
from tests.helpers.launcher import assert_bitwise_equal, final_weights
from tests.helpers.runs import demo_args, raw_metrics
from vitlarge.errors import EXIT_RENDEZVOUS

ROOT = launcher.ROOT
CLUSTER = ROOT / "scripts" / "slurm" / "local_cluster.sh"
DEMO_SBATCH = "scripts/slurm/demo_cpu.sbatch"
JOB_NAME = f"vitlarge-test-{os.getpid()}"  # every job of this session; cancelled at the end
# Same settings for the reference and the preempted job; checkpoints come only from the signals.
# 24 steps: on a fast CPU a stop requested at step 3 landed at step 8 (the signal's way through sbatch, the
# batch shell and srun takes a few steps), and the second stop must still come before the end.
STEPS = 24
PREEMPT_SETTINGS = (f"train.max_steps={STEPS}", "train.checkpoint_every_steps=1000")


@pytest.fixture(scope="session")
def slurm():
    """A working single-node Slurm cluster for the session."""
    ci = os.environ.get("CI", "").lower() in ("true", "1")

    def unavailable(reason: str):
        if ci:
            pytest.fail(f"Slurm tests cannot run: {reason} (CI=true: they must, so this is a failure)")
        pytest.skip(f"Slurm tests need a local cluster: {reason}")

    if os.geteuid() != 0:
        unavailable("not root (local_cluster.sh installs packages and starts munged/slurmctld/slurmd)")
    if not (shutil.which("apt-get") or shutil.which("slurmctld")):
        unavailable("Slurm is not installed and there is no apt-get to install it")
    r = subprocess.run([str(CLUSTER), "up"], capture_output=True, text=True, timeout=900)
    if r.returncode == 77:
        unavailable(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, f"local_cluster.sh up failed:\n{r.stdout}{r.stderr}"
    started = "local_cluster: started" in r.stderr and "started nothing" not in r.stderr
    yield
    subprocess.run(["scancel", f"--name={JOB_NAME}"], capture_output=True, timeout=60)
    if started:
        subprocess.run([str(CLUSTER), "down"], capture_output=True, timeout=120)


def srun(
    args: list[str], ntasks: int = 2, before: list[str] = (), env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """`srun -n N -O [before...] python train.py args` from the repository root, as a user would."""
    cmd = [
        "srun",
        "-n",
        str(ntasks),
        "-O",
        f"--job-name={JOB_NAME}",
        "--time=5",
        *before,
        sys.executable,
        "train.py",
        *args,
    ]
    return subprocess.run(
        cmd, cwd=ROOT, env={**launcher.env(), **(env or {})}, capture_output=True, text=True, timeout=timeout
    )


def sbatch(script_and_args: list[str], log: Path, *options: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`sbatch --parsable [options] script args` from the repository root; stdout is the job id."""
    cmd = ["sbatch", "--parsable", f"--job-name={JOB_NAME}", f"--output={log}", "--time=10", *options, *script_and_args]
    return subprocess.run(cmd, cwd=ROOT, env=launcher.env(), capture_output=True, text=True, timeout=timeout)


def script_args(data: str, workdir: Path, *extra: str) -> list[str]:
    """train.py arguments after demo_cpu.sbatch, which names the recipe itself."""
    return ["--data", data, "--workdir", str(workdir), "train.log_every_steps=1", *extra]


def job_info(job_id: str) -> dict[str, str]:
    """`scontrol show job` as a dict (there is no sacct without accounting); {} once the job is gone."""
    r = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S*)", r.stdout)) if r.returncode == 0 else {}


metrics = raw_metrics  # tests/e2e/test_slurm_multinode.py imports it from here


def last_step(workdir: Path) -> int:
    return max((r["step"] for r in metrics(workdir) if r["event"] == "train"), default=0)


def wait_for(predicate, timeout: float, what: str, log: Path, poll: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; job log:\n{_tail(log)}")


def _tail(log: Path, n: int = 4000) -> str:
    return log.read_text()[-n:] if log.exists() else "(no log)"


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


# --- srun ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def srun_reference(slurm, demo_data, tmp_path_factory):
    """`srun -n 2` for STEPS uninterrupted steps: test (a), and the run the preempted job must match."""
    workdir = tmp_path_factory.mktemp("srun")
    t0 = time.monotonic()
    r = srun(demo_args(demo_data, workdir, *PREEMPT_SETTINGS))
    print(f"srun reference run: {time.monotonic() - t0:.1f}s")
    return workdir, r


def test_srun_two_tasks_train_with_gloo(srun_reference):
    workdir, r = srun_reference
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "total batch size = 128 = 16 (micro) x 4 (accumulation) x 2 (devices)" in out
    assert (
        out.count(f"train step {1:>{len(str(STEPS))}}/{STEPS} ") == 1
    )  # one logging rank: the ranks agree on who is 0
    records = metrics(workdir)
    start = [x for x in records if x["event"] == "start"]
    assert len(start) == 1 and start[0]["world_size"] == 2 and start[0]["accum_steps"] == 4
    assert [x["step"] for x in records if x["event"] == "train"] == list(range(1, STEPS + 1))
    assert [x["step"] for x in records if x["event"] == "checkpoint"] == [STEPS]
    assert (workdir / "model" / "model.safetensors").is_file()


def test_missing_task_fails_at_the_rendezvous_naming_host_and_port(slurm, demo_data, tmp_path):
    """SLURM_NTASKS says 4 but srun starts 2: the rendezvous times out with host:port, not a hang."""
    t0 = time.monotonic()
    r = srun(
        demo_args(demo_data, tmp_path, "train.max_steps=1"),
        before=["env", "SLURM_NTASKS=4"],
        env={"VITLARGE_RENDEZVOUS_TIMEOUT": "5"},
        timeout=240,
    )
    elapsed = time.monotonic() - t0
    assert r.returncode == EXIT_RENDEZVOUS, r.stderr[-3000:]  # a failed rendezvous, not bad input (2)
    errors = _errors(r.stderr)
    assert errors and "Traceback" not in r.stderr, r.stderr[-3000:]
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    master = [e for e in errors if "rank 0 of 4" in e]
    assert master, r.stderr[-3000:]
    assert re.search(
        rf"rendezvous at {re.escape(host)}:2\d{{4}} did not complete within 5s \(rank 0 of 4, slurm; on ", master[0]
    ), master[0]
    assert elapsed < 120, f"took {elapsed:.0f}s: the 5 s rendezvous timeout was not honoured"
    assert not (tmp_path / "checkpoints").exists()


def test_train_py_in_a_batch_script_without_srun_says_use_srun(slurm, demo_data, tmp_path):
    log = tmp_path / "job.log"
    cmd = f"{sys.executable} train.py " + " ".join(demo_args(demo_data, tmp_path, "train.max_steps=1"))
    r = sbatch(["--wrap", cmd], log, "--wait", "--ntasks=2", "--overcommit")
    assert r.returncode != 0, _tail(log)
    assert "start train.py with srun" in _tail(log) and "SLURM_NTASKS=2" in _tail(log)


def test_checkpoint_of_another_recipe_is_refused_under_srun(srun_reference, demo_data):
    """What a requeued job finds when its workdir was reused for another model: exit 2, one clear line."""
    workdir, first = srun_reference
    assert first.returncode == 0
    r = srun(
        demo_args(
            demo_data,
            workdir,
            "train.max_steps=20",
            "model.kwargs={'patch_size': 4, 'embed_dim': 48, 'depth': 2, 'num_heads': 3}",
        )
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    errors = _errors(r.stderr)
    assert errors and all("does not match the recipe" in e for e in errors), r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert last_step(workdir) == STEPS  # nothing trained on top of the foreign checkpoint


# --- sbatch and preemption -------------------------------------------------------------------------------


def test_sbatch_wait_job_completes(slurm, demo_data, tmp_path):
    """demo_cpu.sbatch through `sbatch --wait`: batch shell, requeue.sh, a 2-task srun step, exit 0.

    train.py --help keeps the job under two seconds: sbatch --wait polls after 2, 10 and 42 s. The
    preemption test below runs the same script through real training to completion."""
    log = tmp_path / "job.log"
    t0 = time.monotonic()
    r = sbatch([DEMO_SBATCH, "--help"], log, "--wait")
    print(f"sbatch --wait: {time.monotonic() - t0:.1f}s")
    assert r.returncode == 0, r.stderr + _tail(log)
    job = job_info(r.stdout.strip().split(";")[0])
    assert job.get("JobState") == "COMPLETED" and job.get("ExitCode") == "0:0" and job.get("Restarts") == "0", job
    text = log.read_text()
    assert text.count("usage: train.py") == 2, text  # one per task
    assert "start (restart 0)" in text and "step exited with status 0" in text


def test_preempted_job_checkpoints_requeues_and_resumes_bitwise_equal(srun_reference, demo_data, tmp_path):
    """Two stops in one job: USR1 to the batch shell (the --signal=B:USR1@120 warning), then an outside
    `scontrol requeue` (TERM to every process of the job, srun included, as preemption does)."""
    ref_dir, ref = srun_reference
    assert ref.returncode == 0
    log = tmp_path / "job.log"
    # MLflow on (its default store, <workdir>/mlflow.db): the requeues continue one tracked run (issue 33).
    r = sbatch([DEMO_SBATCH, *script_args(demo_data, tmp_path, *PREEMPT_SETTINGS, "log.mlflow=true")], log)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    try:
        # 1. Time-limit warning: USR1 to the batch shell only; it forwards USR1 through srun to the tasks.
        wait_for(lambda: last_step(tmp_path) >= 3, 240, "step 3", log)
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True, timeout=30)
        wait_for(lambda: job_info(job_id).get("Restarts") == "1", 120, "the requeue after USR1", log)
        first_stop = _checkpoint_steps(tmp_path)
        assert len(first_stop) == 1 and first_stop[0] >= 3, metrics(tmp_path)

        # 2. After the resume, a requeue from outside: Slurm sends TERM to the shell, srun and the tasks.
        wait_for(lambda: last_step(tmp_path) >= first_stop[0] + 3, 240, "progress after the first resume", log)
        subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)
        wait_for(lambda: job_info(job_id).get("Restarts") == "2", 120, "the requeue after TERM", log)

        wait_for(lambda: job_info(job_id).get("JobState") == "COMPLETED", 300, "the job to complete", log)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    job = job_info(job_id)
    assert job["ExitCode"] == "0:0" and job["Requeue"] == "1", job
    stops = _checkpoint_steps(tmp_path)[:-1]  # the last one is the end of training
    assert len(stops) == 2 and stops[0] < stops[1] < STEPS, stops
    text = log.read_text()
    for step in stops:
        assert f"stopped on signal after step {step}; checkpoint" in text, text[-4000:]
        assert f"resumed from {tmp_path / 'checkpoints'}/step_{step:07d} at step {step}" in text, text[-4000:]
    assert "got SIGUSR1" in text and "got SIGTERM" in text
    assert text.count("x 4 (accumulation) x 2 (devices)") == 3  # srun took the job's 2 tasks, each run
    assert "Exited with exit code 75" in text and text.count("(exit 75)") == 2  # srun's line, then ours
    assert "restart 1" in text and "restart 2" in text
    starts = [x["step"] for x in metrics(tmp_path) if x["event"] == "start"]
    assert starts == [0, *stops]
    assert_bitwise_equal(final_weights(ref_dir), final_weights(tmp_path))  # the reference ran untracked
    _assert_one_tracked_run(tmp_path, stops)


def _assert_one_tracked_run(workdir: Path, stops: list[int]) -> None:
    """One MLflow run for the job: a segment per start (the requeues named), every step's latest value metrics.jsonl's."""
    import json

    from mlflow import MlflowClient

    from hooks.jsonl import read_metrics

    run_id = json.loads((workdir / "trackers.json").read_text())["lines"][""]["mlflow"]["id"]
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("demo_digits").experiment_id])
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    segments = [json.loads(v) for k, v in sorted(run.data.tags.items()) if k.startswith("vitlarge.segment.")]
    assert [(s["start_step"], s["reason"]) for s in segments] == [(0, "start")] + [(s, "requeue") for s in stops]
    latest = {}
    for m in sorted(client.get_metric_history(run_id, "train_loss"), key=lambda m: m.timestamp):
        latest[m.step] = m.value
    train = [x for x in read_metrics(str(workdir / "metrics.jsonl")) if x["event"] == "train"]
    assert latest == {x["step"]: x["train_loss"] for x in train}


def _checkpoint_steps(workdir: Path) -> list[int]:
    return [x["step"] for x in metrics(workdir) if x["event"] == "checkpoint"]
