"""scripts/k8s/'s manifests run as their controllers would run them, without a cluster: two pods, each a process tree
in a network namespace of its own, training the digits demo; one pod preempted mid-run and started again.

The pods are what tests/helpers/controllers.py derives from each manifest (the command, its arguments, the variables
the controller injects; its docstring cites the controllers' source), after the changes a user makes for a small job
(2 nodes x 1 process, the demo's arguments). Pod i runs in network namespace vlk8s<pid>-<i>, joined to the other by a
veth pair (10.217.57.1 and .2, nothing in the host's namespace), with a UTS and mount namespace of its own: its host
name is the pod's, and an /etc/hosts bind-mounted over the host's resolves both pods' names, as the job's headless
service does. The file system is shared, as the PersistentVolumeClaim is. The namespaces are removed at the end.

The TrainJob's pods are preempted mid-run; the PyTorchJob's (the operator's other variables, the same command and
restart rules) train to the end without a stop: each start of two pods costs ~25 s on 2 cores. Preemption is what
the kubelet does: SIGTERM to the container's first process (``python -m vitlarge.run.pod``), SIGKILL after
``terminationGracePeriodSeconds``. The job then starts every pod that exited non-zero again, as the pod's
``restartPolicy`` says (``Never``: the Job replaces it with one of the same index and name; ``OnFailure``: the kubelet
restarts its container), up to ``backoffLimit``. Without root, iproute2 or unshare the test skips, except under
CI=true, where it fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, controllers, launcher
from tests.helpers.runs import RECIPE, raw_metrics

STEPS = 14  # past the demo's first epoch (11 steps): the resumed pods cross an epoch boundary
PLAIN_STEPS = 4  # a run without a stop shows the start and the end; its steps add nothing
PREEMPT_AT = 4  # the step after which the kubelet sends SIGTERM to pod 1
NET = "10.217.57"


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"the Kubernetes pod test cannot run: {reason} (CI=true: it must, so this is a failure)")
    pytest.skip(f"the Kubernetes pod test needs network namespaces: {reason}")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def namespaces():
    """Two network namespaces joined by a veth pair, removed afterwards with whatever still runs in them."""
    if os.geteuid() != 0:
        _unavailable("not root")
    if not (shutil.which("ip") and shutil.which("unshare")):
        _unavailable("no ip (iproute2) or unshare (util-linux)")
    names = [f"vlk8s{os.getpid()}-{i}" for i in range(2)]
    made = []
    try:
        for name in names:
            _ip("netns", "add", name)
            made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", names[0], "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", names[1])
        for i, name in enumerate(names):
            _ip("-n", name, "addr", "add", f"{NET}.{i + 1}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
        yield names
    finally:
        for name in made:
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            for pid in pids:
                launcher.kill_tree(int(pid))
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


class Kubelet:
    """Runs each pod's container as a process tree in its namespace and starts it again as the job would."""

    def __init__(self, pods: list[controllers.Pod], namespaces: list[str], tmp: Path):
        self.pods, self.namespaces, self.tmp = pods, namespaces, tmp
        self.hosts = tmp / "hosts"
        self.hosts.write_text(
            "127.0.0.1 localhost\n" + "".join(f"{NET}.{i + 1} {p.fqdn} {p.hostname}\n" for i, p in enumerate(pods))
        )
        self.procs: list[subprocess.Popen] = []
        self.ends: list[list[int]] = [[] for _ in pods]  # each pod's exit statuses, in order
        self.logs: list[Path] = []

    def start(self, i: int) -> None:
        pod = self.pods[i]
        command = [sys.executable if pod.command[0] == "python" else pod.command[0], *pod.command[1:]]
        inside = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'
        argv = ["ip", "netns", "exec", self.namespaces[i], "unshare", "--mount", "--uts", "--propagation", "private"]
        argv += ["sh", "-c", inside, "pod", str(self.hosts), pod.hostname, *command]
        log = self.tmp / f"{pod.hostname}.{len(self.ends[i])}.log"
        self.logs.append(log)
        env = {**launcher.env(), **pod.env}
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.procs[i : i + 1] = [proc]

    def preempt(self, i: int) -> None:
        """The kubelet's end of a pod: SIGTERM to the container's first process, SIGKILL after its grace period."""
        proc = self.procs[i]
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=self.pods[i].grace_s)
        except subprocess.TimeoutExpired:
            launcher.kill_tree(proc.pid)

    def run(self, timeout: float) -> None:
        """Until every pod exited 0; a pod that exits non-zero starts again unless the job fails (its restart
        policy, an exit status in ``fail_job_on``, more failed pods than ``backoffLimit``)."""
        deadline, failures, ended = time.monotonic() + timeout, 0, set()
        while time.monotonic() < deadline:
            for i, (pod, proc) in enumerate(zip(self.pods, self.procs)):
                status = proc.poll()
                if status is None or (i, proc.pid) in ended:
                    continue
                ended.add((i, proc.pid))
                self.ends[i].append(status)
                if status != 0:
                    failures += 1
                    if not pod.restart or status in pod.fail_job_on or failures > pod.backoff_limit:
                        raise AssertionError(f"the job failed: pod {pod.hostname} exited {status}\n{self.tails()}")
                    self.start(i)
            if all(e and e[-1] == 0 for e in self.ends):
                return
            time.sleep(0.2)
        raise AssertionError(f"the job did not finish in {timeout:.0f}s\n{self.tails()}")

    def tails(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-2500:]}" for log in self.logs)

    def stop_all(self) -> None:
        for proc in self.procs:
            launcher.kill_tree(proc.pid)


def train_records(workdir: Path) -> list[dict]:
    return [r for r in raw_metrics(workdir) if r["event"] == "train"]


def pods_of(manifest: str, args: list[str]) -> list[controllers.Pod]:
    """The pods of scripts/k8s/<manifest>.yaml changed for 2 nodes x 1 process running ``args``."""
    docs = controllers.scaled(controllers.load(ROOT / "scripts" / "k8s" / f"{manifest}.yaml"), 2, 1, args)
    if manifest == "trainjob":
        return controllers.trainjob_pods(docs)
    return controllers.pytorchjob_pods(controllers.by_kind(docs, "PyTorchJob"))


@pytest.mark.parametrize(
    "manifest,preempt", [("trainjob", True), ("pytorchjob", False)], ids=["trainjob-preempted", "pytorchjob"]
)
def test_two_pods_train_the_demo_to_the_end_and_a_preempted_pod_resumes_the_run(
    manifest, preempt, namespaces, demo_data, tmp_path
):
    workdir = tmp_path / "workdir"  # the shared PersistentVolumeClaim
    args = ["train.py", "--config", RECIPE, "--data", demo_data, "--workdir", str(workdir)]
    steps = STEPS if preempt else PLAIN_STEPS
    args += ["train.log_every_steps=1", f"train.max_steps={steps}", "train.checkpoint_every_steps=1000"]
    pods = pods_of(manifest, args)
    assert [p.env["PET_NODE_RANK"] for p in pods] == ["0", "1"]
    kubelet = Kubelet(pods, namespaces, tmp_path)
    t0 = time.monotonic()
    try:
        for i in range(len(pods)):
            kubelet.start(i)
        if preempt:
            past = lambda: any(r["step"] >= PREEMPT_AT for r in train_records(workdir))  # noqa: E731
            assert launcher.wait_for(past, 120, kubelet.procs[0]), kubelet.tails()
            kubelet.preempt(1)
        kubelet.run(timeout=180)
    finally:
        kubelet.stop_all()
    print(f"{manifest}: {time.monotonic() - t0:.1f}s, exit statuses {kubelet.ends}")

    log = kubelet.tails()
    assert "vitlarge.run.pod: --nnodes=2 --node_rank=1 --nproc_per_node=1" in kubelet.logs[1].read_text(), log
    starts = [r for r in raw_metrics(workdir) if r["event"] == "start"]
    assert starts[0]["step"] == 0 and starts[0]["world_size"] == 2, starts
    # nothing lost, nothing replayed: every step once (the resumed ones after the checkpoint SIGTERM wrote)
    assert [r["step"] for r in train_records(workdir)] == list(range(1, steps + 1))
    assert (workdir / "model" / "model.safetensors").is_file()
    if not preempt:
        assert kubelet.ends == [[0], [0]] and len(starts) == 1, (kubelet.ends, starts)
        return
    assert kubelet.ends[1][0] == 75, log  # pod 1 checkpointed on SIGTERM
    assert kubelet.ends[0][0] == 75, log  # and so did pod 0, at the same step (the stop is shared)
    assert kubelet.ends == [[75, 0], [75, 0]], kubelet.ends  # each started again once, as restartPolicy says
    assert len(starts) == 2, starts  # the restart is one start record
    stopped = starts[1]["step"]
    assert PREEMPT_AT <= stopped < STEPS and starts[1]["world_size"] == 2, starts
    assert f"resumed from {workdir / 'checkpoints'}/step_{stopped:07d} at step {stopped}" in log, log
