"""Slurm across nodes, for real: a two-node cluster on this machine, each node in its own network namespace.

`scripts/slurm/local_cluster.sh up --nodes 2` starts slurmctld in the host namespace and one slurmd
per node (vlnode1 = 10.213.0.2, vlnode2 = 10.213.0.3, each with its own network, UTS and mount
namespace, on bridge vlbr0 = 10.213.0.1). The file system is shared, as a cluster's shared file
system is. Traffic stays on addresses the script assigned to interfaces it made; the module's
teardown waits (bounded) for its jobs to end, then removes them (`down`); tests/e2e/test_slurm.py runs first.
Without root, iproute2 or namespaces the tests skip, except under CI=true, where they fail.

What is covered, each against the same world size on one node (`colossalai run`), bit for bit:
`srun -N 2 -n 4` (two per node, SLURM_LOCALID 0/1 on each, CPUs oversubscribed, thread budget from
SLURM_STEP_TASKS_PER_NODE); demo_cpu.sbatch on two nodes stopped by USR1 (checkpoint by ranks on both
nodes, exit 75, requeue, resume on both nodes); kill -9 of the rank on node 2 (the job fails at once,
naming the lost task, and the `srun -N 2 -n 2` rerun - one task per node, the master another host than
the task's own, gloo on each node's eth0 - resumes from the last complete checkpoint); a node whose
task never joins (rendezvous timeout naming host, port, interface). With the same world size gloo's
ring order is the same, so the bitwise comparisons check the rank / shard mapping across nodes, not
the network path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.test_slurm import (
    CLUSTER,
    DEMO_SBATCH,
    JOB_NAME,
    _errors,
    _tail,
    job_info,
    last_step,
    metrics,
    sbatch,
    script_args,
    wait_for,
)
from tests.helpers import launcher
from tests.helpers.launcher import assert_bitwise_equal, final_weights
from tests.helpers.runs import demo_args

ROOT = launcher.ROOT
NODES = ("vlnode1", "vlnode2")
STEPS = 12  # enough that a stop requested at step 2 lands before the end on a fast CPU (it took 4 steps once)
SETTINGS = (f"train.max_steps={STEPS}", "train.checkpoint_every_steps=1000")  # reference and preempted job


@pytest.fixture(scope="module")
def cluster2():
    """A two-node cluster for this module; afterwards, once the module's jobs are gone (bounded wait), the
    cluster is down with nothing of it left (no shape flip back to one node: tests/e2e/test_slurm.py brings that
    up itself when it runs, and runs first in `make test`)."""
    ci = os.environ.get("CI", "").lower() in ("true", "1")

    def unavailable(reason: str):
        if ci:
            pytest.fail(f"two-node Slurm tests cannot run: {reason} (CI=true: they must, so this is a failure)")
        pytest.skip(f"two-node Slurm tests need a local cluster in network namespaces: {reason}")

    if os.geteuid() != 0:
        unavailable("not root (local_cluster.sh creates network namespaces and starts Slurm daemons)")
    if not (shutil.which("apt-get") or shutil.which("slurmctld")):
        unavailable("Slurm is not installed and there is no apt-get to install it")
    t0 = time.monotonic()
    r = subprocess.run([str(CLUSTER), "up", "--nodes", "2"], capture_output=True, text=True, timeout=900)
    if r.returncode == 77:
        unavailable(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, f"local_cluster.sh up --nodes 2 failed:\n{r.stdout}{r.stderr}"
    print(f"two-node cluster up: {time.monotonic() - t0:.1f}s")
    yield
    subprocess.run(["scancel", f"--name={JOB_NAME}"], capture_output=True, timeout=60)
    for _ in range(60):  # slurmstepd and the tasks outlive a stopped slurmd (KillWait): let them end first
        q = subprocess.run(["squeue", "-h", f"--name={JOB_NAME}"], capture_output=True, text=True, timeout=30)
        if q.returncode == 0 and not q.stdout.strip():
            break
        time.sleep(1)
    r = subprocess.run([str(CLUSTER), "down"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "vlnode" not in left, f"namespaces left behind: {left}"


def srun(
    nodes: int,
    ntasks: int,
    args: list[str],
    before: list[str] = (),
    env: dict | None = None,
    timeout: float = 300,
    command: list[str] | None = None,
    drop: tuple = (),
) -> subprocess.CompletedProcess:
    """`srun -N nodes -n ntasks -O [before...] python train.py args` from the repository root; ``drop``:
    variables of the tests' usual environment (tests/helpers/launcher.py) the tasks must not get."""
    cmd = [
        "srun",
        "-N",
        str(nodes),
        "-n",
        str(ntasks),
        "-O",
        f"--job-name={JOB_NAME}",
        "--time=5",
        *before,
        *(command or [sys.executable, "train.py"]),
        *args,
    ]
    full = {k: v for k, v in {**launcher.env(), **(env or {})}.items() if k not in drop}
    return subprocess.run(cmd, cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)


def timed(what: str, fn, *args, **kwargs):
    t0 = time.monotonic()
    result = fn(*args, **kwargs)
    print(f"{what}: {time.monotonic() - t0:.1f}s")
    return result


def assert_ok(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.fixture(scope="module")
def one_node_2(demo_data, tmp_path_factory):
    """The same world size (2) on one node: `colossalai run --nproc_per_node 2`, STEPS steps."""
    workdir = tmp_path_factory.mktemp("one_node_2")
    assert_ok(timed("colossalai run, 2 processes", launcher.run, demo_args(demo_data, workdir, *SETTINGS), nproc=2))
    return workdir


def test_srun_two_tasks_per_node_matches_one_node_bitwise(cluster2, demo_data, tmp_path):
    """4 ranks, 2 per node: SLURM_LOCALID is 0 and 1 on each node; 4 processes on 2 CPUs. The srun tasks get
    no OMP_NUM_THREADS, as srun starts them: the thread budget comes from Slurm's tasks per node (still 1
    thread, so the bitwise comparison with 4 colossalai-run processes holds)."""
    steps = ("train.max_steps=3", "train.checkpoint_every_steps=1000")
    one = tmp_path / "one_node"
    assert_ok(timed("colossalai run, 4 processes", launcher.run, demo_args(demo_data, one, *steps), nproc=4))
    two = tmp_path / "two_nodes"
    r = timed(
        "srun -N 2 -n 4",
        srun,
        2,
        4,
        demo_args(demo_data, two, *steps),
        before=["--ntasks-per-node=2"],
        drop=("OMP_NUM_THREADS",),
    )
    assert_ok(r)
    assert "x 4 (devices)" in r.stdout + r.stderr
    assert re.search(
        r"threads: 1 per process \(\d+ usable CPUs / 2 tasks on this node \(SLURM_STEP_TASKS_PER_NODE\)\)",
        r.stdout + r.stderr,
    ), (r.stdout + r.stderr)[-3000:]
    assert sorted(p.name for p in (two / "checkpoints" / "step_0000003").glob("rank_*.pt")) == [
        f"rank_{i:05d}.pt" for i in range(4)
    ]
    assert_bitwise_equal(final_weights(one), final_weights(two))


def test_where_tasks_run(cluster2):
    """The layout the other tests rely on: ranks 0..3 on vlnode1, vlnode1, vlnode2, vlnode2, with their own
    hostnames and addresses, and SLURM_LOCALID counting per node."""
    r = srun(
        2,
        4,
        [],
        before=["--ntasks-per-node=2", "--label"],
        command=["bash", "-c", 'echo "$(hostname) $SLURM_LOCALID $(hostname -I)"'],
        timeout=60,
    )
    assert_ok(r)
    lines = sorted(r.stdout.split("\n"))
    assert [line.split()[:3] for line in lines if line] == [
        ["0:", "vlnode1", "0"],
        ["1:", "vlnode1", "1"],
        ["2:", "vlnode2", "0"],
        ["3:", "vlnode2", "1"],
    ], r.stdout
    assert "10.213.0.3" in lines[-1] and "10.213.0.2" in lines[-3], r.stdout


def test_preempted_two_node_job_checkpoints_requeues_and_resumes_bitwise_equal(
    cluster2, one_node_2, demo_data, tmp_path
):
    """demo_cpu.sbatch on 2 nodes (--nodes=2 --ntasks-per-node=1): USR1 to the batch shell mid-run."""
    ref_dir = one_node_2  # colossalai run, the same world size on one node
    log = tmp_path / "job.log"
    t0 = time.monotonic()
    r = sbatch([DEMO_SBATCH, *script_args(demo_data, tmp_path, *SETTINGS)], log, "--nodes=2", "--ntasks-per-node=1")
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: last_step(tmp_path) >= 2, 240, "step 2", log)
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True, timeout=30)
        wait_for(lambda: job_info(job_id).get("Restarts") == "1", 120, "the requeue after USR1", log)
        wait_for(lambda: job_info(job_id).get("JobState") == "COMPLETED", 300, "the job to complete", log)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    print(f"preempted two-node job: {time.monotonic() - t0:.1f}s")
    job = job_info(job_id)
    assert job["ExitCode"] == "0:0" and job["NumNodes"] == "2" and job["NodeList"] == "vlnode[1-2]", job
    stops = [x["step"] for x in metrics(tmp_path) if x["event"] == "checkpoint"][:-1]
    assert len(stops) == 1 and 2 <= stops[0] < STEPS, metrics(tmp_path)
    stop = tmp_path / "checkpoints" / f"step_{stops[0]:07d}"
    assert sorted(p.name for p in stop.glob("rank_*.pt")) == ["rank_00000.pt", "rank_00001.pt"]  # one per node
    text = log.read_text()
    assert f"stopped on signal after step {stops[0]}; checkpoint" in text, text[-4000:]
    assert f"resumed from {tmp_path / 'checkpoints'}/step_{stops[0]:07d} at step {stops[0]}" in text, text[-4000:]
    assert "Exited with exit code 75" in text and "(exit 75)" in text and "restart 1" in text
    assert text.count("on vlnode[1-2]") == 2  # both runs on both nodes
    assert_bitwise_equal(final_weights(ref_dir), final_weights(tmp_path))


def test_node_whose_tasks_never_join_times_out_naming_host_and_port(cluster2, demo_data, tmp_path):
    """vlnode2's task never starts train.py: the task on vlnode1 fails the rendezvous, naming vlnode1:port, its
    host, interface and time (one task per node: tests/e2e/test_slurm.py shows every surviving task reports it)."""
    wrapper = [
        "bash",
        "-c",
        'if [ "$SLURM_NODEID" = 1 ]; then exec sleep 120; fi; exec "$0" "$@"',
        sys.executable,
        "train.py",
    ]
    t0 = time.monotonic()
    r = srun(
        2,
        2,
        demo_args(demo_data, tmp_path, "train.max_steps=1"),
        command=wrapper,
        before=["--ntasks-per-node=1", "--kill-on-bad-exit=1"],
        env={"VITLARGE_RENDEZVOUS_TIMEOUT": "5"},
        timeout=240,
    )
    elapsed = time.monotonic() - t0
    print(f"missing node: {elapsed:.1f}s")
    assert r.returncode != 0, r.stderr[-3000:]
    errors = _errors(r.stderr)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    for rank in (0,):  # the surviving task says where it waited
        mine = [e for e in errors if f"(rank {rank} of 2, slurm; on vlnode1, interface eth0," in e]
        assert mine and re.search(r"rendezvous at vlnode1:2\d{4} did not complete within 5s", mine[0]), errors
    # The tasks of node 2 sleep 120 s: ending before that proves nobody waited for them (the 5 s is in the message).
    assert elapsed < 120, f"took {elapsed:.0f}s: the 5 s rendezvous timeout was not honoured"
    assert not (tmp_path / "checkpoints").exists()


def _task(rank: int, workdir: Path) -> psutil.Process | None:
    """The train.py process of ``rank`` training into ``workdir`` (whichever node runs it)."""
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if "train.py" in cmd and str(workdir) in cmd and p.environ().get("SLURM_PROCID") == str(rank):
                return p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_kill_9_of_a_rank_on_node_2_fails_the_job_and_the_rerun_resumes(cluster2, one_node_2, demo_data, tmp_path):
    """The rank on vlnode2 dies (kill -9) after the checkpoint at step 2: every task ends, srun names
    the lost task; the same command again resumes from step 2 and ends bitwise equal to the reference."""
    ref_dir = one_node_2
    args = demo_args(demo_data, tmp_path, f"train.max_steps={STEPS}", "train.checkpoint_every_steps=2")
    cmd = ["srun", "-N", "2", "-n", "2", "-O", f"--job-name={JOB_NAME}", "--time=5", sys.executable, "train.py", *args]
    log = tmp_path / "srun.log"
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=launcher.env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: last_step(tmp_path) >= 3, 240, "step 3 (after the checkpoint at step 2)", log)
        victim = _task(1, tmp_path)
        assert victim is not None, _tail(log)
        killed_at = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        rc = proc.wait(timeout=300)
        failed_after = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"kill -9 run: {time.monotonic() - t0:.1f}s, job failed {failed_after:.1f}s after the kill")
    text = log.read_text()
    assert rc != 0, text[-3000:]
    assert re.search(r"srun: error: vlnode2: task 1: Killed", text), text[-3000:]
    assert failed_after < 60, f"the job took {failed_after:.0f}s to fail after its rank 1 died"
    assert _task(0, tmp_path) is None and _task(1, tmp_path) is None
    complete = sorted(int(p.name[5:]) for p in (tmp_path / "checkpoints").glob("step_*"))
    assert complete and complete[-1] < STEPS, complete
    r = timed("kill -9 rerun", srun, 2, 2, args)
    assert_ok(r)
    out = r.stderr + r.stdout
    assert f"resumed from {tmp_path / 'checkpoints'}/step_{complete[-1]:07d} at step {complete[-1]}" in out
    # srun -N 2 -n 2 (one task per node): the master is vlnode1 as each node resolves it, reached over the
    # namespace's eth0, not loopback (gloo only; NCCL picks its own). Only rank 0 logs INFO lines.
    assert re.search(r"rendezvous at vlnode1:2\d{4}, gloo interface on vlnode1: eth0", out), out[-3000:]
    assert "x 2 (devices)" in out and "threads: 1 per process (OMP_NUM_THREADS=1)" in out
    # The same world size on one node (colossalai run): with gloo's ring order the same, this shows the rank /
    # shard mapping across nodes and the resume, not the network path.
    assert_bitwise_equal(final_weights(ref_dir), final_weights(tmp_path))


# --- losing a node: last in the module, it crashes vlnode2 and starts it again -------------------------------
ELASTIC_STEPS = 30


def test_job_on_a_node_range_that_loses_a_node_is_requeued_and_continues_on_the_node_left(
    cluster2, demo_data, tmp_path
):
    """`sbatch --nodes=1-2 demo_cpu.sbatch`: 2 tasks on each of 2 nodes (world 4, 16 x 2 x 4). vlnode2 fails
    mid-run (`local_cluster.sh crash`: kill -9 of its slurmd, slurmstepd and tasks, as a power loss). slurmctld
    marks it down (SlurmdTimeout), ends the job with NODE_FAIL and requeues it; the requeued job gets the one
    node left and resumes at world 2 with the global batch kept (16 x 4 x 2), saying so in one line. The run
    ends at the same step count, every step at the lr the plan gives it."""
    from vitlarge.config.load import load_config
    from vitlarge.plan.plan import make_plan

    settings = (f"train.max_steps={ELASTIC_STEPS}", "train.checkpoint_every_steps=2")
    log = tmp_path / "job.log"
    t0 = time.monotonic()
    r = sbatch([DEMO_SBATCH, *script_args(demo_data, tmp_path, *settings)], log, "--nodes=1-2")
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: last_step(tmp_path) >= 5, 240, "step 5 on two nodes", log)
        assert job_info(job_id).get("NodeList") == "vlnode[1-2]", job_info(job_id)
        crash = subprocess.run([str(CLUSTER), "crash", "vlnode2"], capture_output=True, text=True, timeout=60)
        assert crash.returncode == 0, crash.stderr
        crashed_at = time.monotonic()
        wait_for(lambda: job_info(job_id).get("Restarts") == "1", 180, "the requeue after the node failure", log)
        requeued_after = time.monotonic() - crashed_at
        wait_for(lambda: job_info(job_id).get("JobState") == "COMPLETED", 300, "the job to complete on one node", log)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
        back = subprocess.run([str(CLUSTER), "up", "--nodes", "2"], capture_output=True, text=True, timeout=300)
    print(f"lost node: {time.monotonic() - t0:.1f}s, requeued {requeued_after:.1f}s after the crash")
    assert back.returncode == 0, f"vlnode2 did not come back:\n{back.stderr}"
    job = job_info(job_id)
    assert job["ExitCode"] == "0:0" and job["NodeList"] == "vlnode1" and job["NumNodes"] == "1", job
    text = log.read_text()
    assert "DUE TO NODE FAILURE" in text, text[-4000:]
    assert "start (restart 0) on vlnode[1-2] (2 node(s))" in text and "start (restart 1) on vlnode1 (1 node(s))" in text
    assert (
        "16 (micro) x 2 (accumulation) x 4 (devices)" in text and "16 (micro) x 4 (accumulation) x 2 (devices)" in text
    )

    records = metrics(tmp_path)
    starts = [x for x in records if x["event"] == "start"]
    assert [(x["world_size"], x["accum_steps"], x["global_batch"]) for x in starts] == [(4, 2, 128), (2, 4, 128)]
    resumed = starts[1]["step"]
    assert resumed >= 2 and resumed % 2 == 0, starts
    line = (
        f"warning: {tmp_path / 'checkpoints'}/step_{resumed:07d} was written by 4 processes, this run has 2: weights, "
        "optimizer (re-sharded), step and lr schedule resume exactly, the global batch stays 128 (4 micro-steps "
        "per step now)"
    )
    assert text.count(line) == 1, text[-4000:]
    # The second run: every step after the resumed one, once, to the same end; the lr of each step as planned.
    last_run = records[records.index(starts[1]) :]
    steps = [x["step"] for x in last_run if x["event"] == "train"]
    assert steps == list(range(resumed + 1, ELASTIC_STEPS + 1)), steps
    cfg = load_config(ROOT / "recipes" / "demo_digits.py", [f"data.path={demo_data}", *settings])
    plan = make_plan(
        cfg, 2, json.loads((Path(demo_data) / "dataset.json").read_text())["splits"]["train"]["num_examples"]
    )
    lrs = {x["step"]: x["lr"] for x in records if x["event"] == "train"}
    # record "step": s is the s-th optimizer step, taken at the lr of step index s - 1
    assert all(lrs[s] == pytest.approx(plan.lr_at(cfg, s - 1), rel=1e-9) for s in lrs), lrs
    assert [x["step"] for x in records if x["event"] == "checkpoint"][-1] == ELASTIC_STEPS
