"""What the launcher (torchrun, `colossalai run`, srun, or none) tells this process: rank, world size, rendezvous address."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from vitlarge.errors import UserError


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job. ``source`` names the launcher that was detected."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def int_env(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise UserError(
            f"environment variable {key}={env[key][:40]!r} is not an integer; fix the launcher settings"
        ) from None


def slurm_hosts(nodelist: str) -> list[str]:
    """The host names of a Slurm node list (``vlnode[1-2]``), expanded by ``scontrol show hostnames``."""
    if not any(c in nodelist for c in "[,"):
        return [nodelist]
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        hosts = out.stdout.split()
        if not hosts:
            raise IndexError
        return hosts
    except (OSError, subprocess.CalledProcessError, IndexError):
        raise UserError(
            f"cannot expand SLURM_JOB_NODELIST={nodelist!r} with 'scontrol show hostnames'; set MASTER_ADDR"
        ) from None


def _first_slurm_host(nodelist: str) -> str:
    return slurm_hosts(nodelist)[0]


def detect(env: Mapping[str, str] | None = None) -> DistEnv:
    """Reads the launcher's variables; torchrun's win over Slurm's (torchrun inside an allocation)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = int_env(env, "RANK"), int_env(env, "WORLD_SIZE")
        local = int_env(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        addr = env.get("MASTER_ADDR", "127.0.0.1")
        port = int_env(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500
        source = "torchrun"
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = int_env(env, "SLURM_PROCID"), int_env(env, "SLURM_NTASKS")
        if world > 1 and "SLURM_STEP_ID" not in env:
            raise UserError(
                f"this is a Slurm batch script (SLURM_NTASKS={world} but no SLURM_STEP_ID), not one of its "
                "tasks; start train.py with srun (srun python train.py ...) so that every task runs"
            )
        local = int_env(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "127.0.0.1")
        addr = env.get("MASTER_ADDR") or _first_slurm_host(nodelist)
        job = int_env(env, "SLURM_JOB_ID") if env.get("SLURM_JOB_ID") else 0
        port = int_env(env, "MASTER_PORT") if env.get("MASTER_PORT") else 20000 + job % 20000
        source = "slurm"
    else:
        rank, world, local = 0, 1, 0
        addr, port, source = "127.0.0.1", free_port(), "single"
    if world < 1 or not 0 <= rank < world:
        raise UserError(
            f"inconsistent launcher variables ({source}): rank {rank} with world size {world}; "
            "check --nproc_per_node / srun -n"
        )
    return DistEnv(rank, world, local, addr, port, source)


@dataclass(frozen=True)
class PodRendezvous:
    """What a Kubernetes training controller tells a pod: how many pods (torchrun's nodes), this pod's index among
    them, processes per pod, and the first pod's address and port. ``source`` names the variables read."""

    nnodes: int
    node_rank: int
    nproc_per_node: str  # a count, or torchrun's "auto" / "gpu" / "cpu"
    master_addr: str
    master_port: int
    source: str

    def torchrun_args(self) -> list[str]:
        """torchrun's options for this pod (static rendezvous; a failed pod is restarted by the controller)."""
        return [
            f"--nnodes={self.nnodes}",
            f"--node_rank={self.node_rank}",
            f"--nproc_per_node={self.nproc_per_node}",
            f"--master_addr={self.master_addr}",
            f"--master_port={self.master_port}",
        ]


PET_RENDEZVOUS = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
POD_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


MAX_PODS = 65_536
"""The most pods (torchrun's nodes) a pod's rendezvous may name: far above any job, far below what overflows."""
MAX_PROCS_PER_POD = 1024
"""The most processes per pod ``PET_NPROC_PER_NODE`` may name (a node has 8 or 16 GPUs)."""
NPROC_WORDS = ("auto", "gpu", "cpu")  # torchrun's --nproc_per_node words: from the GPUs, else the CPUs


def pod_rendezvous(env: Mapping[str, str]) -> PodRendezvous:
    """The rendezvous in a pod's environment. Kubeflow Trainer's torch runtime (TrainJob) and the training operator
    from 1.8 (PyTorchJob) set ``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` and, when
    known, ``PET_NPROC_PER_NODE`` (torchrun's own option variables); older PyTorchJobs set only ``MASTER_ADDR``,
    ``MASTER_PORT``, ``WORLD_SIZE`` (the pods) and ``RANK`` (this pod), one process per pod. Without either set
    each pod would train a run of its own into the shared workdir: a ``UserError`` says so. Every value is checked
    here, as torchrun would refuse it later with a traceback: counts in range, a port 1..65535, the master a host
    name or an IP address (it reaches torchrun as an argument, never through a shell)."""
    if any(k in env for k in PET_RENDEZVOUS):
        missing = [k for k in PET_RENDEZVOUS if k not in env]
        if missing:
            raise UserError(
                f"this pod has {', '.join(k for k in PET_RENDEZVOUS if k in env)} but not {', '.join(missing)}: "
                "start it from a TrainJob on the torch runtime or a PyTorchJob with a Master (scripts/k8s/), "
                "whose controllers set all of them"
            )
        if ":" in env["PET_NNODES"]:
            raise UserError(
                f"environment variable PET_NNODES={env['PET_NNODES'][:40]!r} is a range of nodes (an elastic "
                "PyTorchJob): elastic PyTorchJobs are not supported; set replicas and no elasticPolicy"
            )
        keys = PET_RENDEZVOUS  # (pods, this pod, master address, master port), as the other branch's
        nproc = _nproc_per_node(env.get("PET_NPROC_PER_NODE") or "1")
    elif all(k in env for k in POD_RENDEZVOUS):
        keys, nproc = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"), "1"
    else:
        raise UserError(
            f"this pod has no rendezvous from a training controller (neither {', '.join(PET_RENDEZVOUS)} nor "
            f"{', '.join(POD_RENDEZVOUS)} is set), so every pod would train a run of its own: submit "
            "scripts/k8s/trainjob.yaml (Kubeflow Trainer) or scripts/k8s/pytorchjob.yaml (PyTorchJob), whose "
            "controllers set them, or start train.py with torchrun"
        )
    source = "PET_*" if keys[0] == "PET_NNODES" else "MASTER_*"
    nnodes, rank = int_env(env, keys[0]), int_env(env, keys[1])
    addr, port = _master_host(keys[2], env[keys[2]]), int_env(env, keys[3])
    if not 1 <= nnodes <= MAX_PODS:
        raise UserError(
            f"environment variable {keys[0]}={env[keys[0]][:40]!r} must be a count of pods 1..{MAX_PODS:,}; "
            "check numNodes / replicas"
        )
    if not 0 <= rank < nnodes:
        raise UserError(
            f"inconsistent controller variables ({source}): pod {rank} of {nnodes}; check numNodes / replicas"
        )
    if not 1 <= port <= 65535:
        raise UserError(
            f"environment variable {keys[3]}={env[keys[3]][:40]!r} is not a port (1..65535); "
            "set the job's master port (PyTorchJob: the container port pytorchjob-port)"
        )
    return PodRendezvous(nnodes, rank, nproc, addr, port, source)


def _nproc_per_node(raw: str) -> str:
    """``PET_NPROC_PER_NODE`` as torchrun takes it: a count 1..`MAX_PROCS_PER_POD`, or one of its words."""
    if raw in NPROC_WORDS:
        return raw
    count = int(raw) if raw.isascii() and raw.isdigit() else 0
    if not 1 <= count <= MAX_PROCS_PER_POD:
        raise UserError(
            f"environment variable PET_NPROC_PER_NODE={raw[:40]!r} must be a count of processes 1.."
            f"{MAX_PROCS_PER_POD} or one of {', '.join(NPROC_WORDS)}; set numProcPerNode / nprocPerNode"
        )
    return str(count)


_HOST_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def _master_host(key: str, raw: str) -> str:
    """The master's address as torch's ``parse_rendezvous_endpoint`` takes it: an IPv4 or IPv6 address, or a host
    name (dot-separated labels of letters, digits, ``-`` and ``_``, at most 253 characters); else a `UserError`.
    An IPv6 address may come in brackets; it is returned without them, as torch reads it."""
    try:
        return str(ipaddress.ip_address(raw[1:-1] if raw[:1] == "[" and raw[-1:] == "]" else raw))
    except ValueError:
        pass
    labels = raw.removesuffix(".").split(".")
    if not 0 < len(raw) <= 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise UserError(
            f"environment variable {key}={raw[:80]!r} is not a host name or an IP address; "
            "the controller sets it to the first pod's name: start the pod from scripts/k8s/"
        )
    return raw


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_rank(env: Mapping[str, str] | None = None) -> int | None:
    """This process's rank as its launcher set it (``RANK``, else ``SLURM_PROCID``; 0 without a
    launcher), read without validation; None when unreadable. Known before any process group."""
    env = os.environ if env is None else env
    key = "RANK" if "RANK" in env else "SLURM_PROCID" if "SLURM_PROCID" in env else None
    try:
        return int(env[key]) if key else 0
    except ValueError:
        return None


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])  # after "pid (comm) state": the parent's pid


def under_colossalai_run(pid: int | None = None, levels: int = 8) -> bool:
    """Whether ``colossalai run`` started this process (an ancestor's command line is ``... colossalai run ...``).
    It hands its arguments to torchrun through an unquoted ``bash -c``: quotes are lost, spaces split a value,
    braces and parentheses are the shell's. False where /proc cannot tell (not Linux)."""
    return _colossalai_runner(os.getpid() if pid is None else pid, levels) is not None


def check_split_arguments(overrides: list[str]) -> None:
    """An override without ``=`` under ``colossalai run`` is, as a rule, the tail of a value its shell split at a
    space (``--workdir "runs/my run"`` arrives as ``--workdir runs/my run``): one line saying so."""
    bad = next((o for o in overrides if "=" not in o), None)
    if bad is not None and under_colossalai_run():
        raise UserError(
            f"command line: argument '{bad}' has no '=': colossalai run passes the arguments through bash unquoted, "
            "which splits a path or value at its spaces; use a path without spaces, or start with torchrun or srun, "
            "which keep them"
        )


_WATCH_RUNNER = """
import os, signal, sys, time
launcher, runner = int(sys.argv[1]), int(sys.argv[2])
def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
def alive(pid, started):
    s = stat(pid)  # the same process, not another that reused its pid: its start time is the same
    return s is not None and s[0] != "Z" and s[19] == started
begun = {pid: (stat(pid) or [None] * 20)[19] for pid in (launcher, runner)}
if None in begun.values() or launcher <= 1:
    sys.exit(0)
while alive(launcher, begun[launcher]):
    time.sleep(0.2)
deadline = time.monotonic() + 5
while alive(runner, begun[runner]) and time.monotonic() < deadline:
    time.sleep(0.2)
if alive(runner, begun[runner]):
    os.kill(runner, signal.SIGTERM)
"""


def _colossalai_runner(pid: int, levels: int = 8) -> int | None:
    """The pid of ``colossalai run``'s per-host runner process above ``pid`` (the nearest ancestor whose command
    line is ``colossalai run``: a fork of the main one), or None."""
    try:
        for _ in range(levels):
            pid = _parent(pid)
            if pid <= 1:
                return None
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
            if any(a.endswith("colossalai") and nxt == "run" for a, nxt in zip(argv, argv[1:])):
                return pid
    except (OSError, ValueError, IndexError):
        pass
    return None


def release_colossalai_run_after_ctrl_c() -> None:
    """Ends the wait that ``colossalai run`` (0.5.0) never leaves after Ctrl-C: its main process aborts ("Aborted!")
    and joins its per-host runner, which, once torchrun has exited, waits for an "exit" message the aborted main
    process never sends; the terminal hangs until a second Ctrl-C. Called by a worker leaving after Ctrl-C: a
    detached watcher waits for torchrun (this process's parent) to exit and, if the runner is still there 5 s
    later (it leaves at once when its main process is alive), ends it with SIGTERM, so ``colossalai run`` returns."""
    runner = _colossalai_runner(os.getpid())
    if runner is None:
        return

    try:
        subprocess.Popen(
            [sys.executable, "-c", _WATCH_RUNNER, str(os.getppid()), str(runner)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        pass


_after_launcher: int | None = None  # what `colossalai run` writes its stderr to, opened by `keep_colossalai_run_stderr`


def keep_colossalai_run_stderr() -> None:
    """Under ``colossalai run``, opens (once) what its processes write their stderr to (a terminal or a file), for
    `say_after_colossalai_run`. Colossal-AI 0.5.0's ``colossalai run`` has no SIGTERM handler: a SIGTERM to its
    process group (``kill -- -PGID``, ``timeout``, a supervisor) ends it and its runner at once (status 143), and with
    them the pipes the workers print through; torchrun passes the signal on (its workers run in sessions of their
    own) and they checkpoint seconds later with no reader for their line. No-op elsewhere, and where the stream
    cannot be opened (a socket, another user's, not Linux)."""
    global _after_launcher
    runner = _colossalai_runner(os.getpid()) if _after_launcher is None else None
    if runner is None:
        return
    try:  # no controlling terminal taken, never inherited, never blocking on a full pipe
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_CLOEXEC | os.O_NONBLOCK
        _after_launcher = os.open(f"/proc/{runner}/fd/2", flags)
    except OSError:
        pass


def say_after_colossalai_run(line: str) -> bool:
    """Writes ``line``, and why it comes after ``colossalai run`` returned, to the stream kept by
    `keep_colossalai_run_stderr`, then closes it; whether it did (False: not under ``colossalai run``, said already,
    or that stream is gone too). Closed at once: where the stream is a pipe (``| tee``, a supervisor capturing the
    output), its reader sees the end with the line, not when this process exits."""
    global _after_launcher
    if _after_launcher is None:
        return False
    fd, _after_launcher = _after_launcher, None
    why = (
        " (after colossalai run had returned 143: it does not wait for its workers on a SIGTERM; "
        "python -m vitlarge.run, torchrun and srun do)"
    )
    try:
        os.write(fd, f"{line}{why}\n".encode())
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
