"""Runs train.py the way users do (plain python, torchrun, colossalai run, python -m vitlarge.run) and kills whole
process trees.

torchrun (and so colossalai run) starts its workers in new sessions, so killing the launcher's
process group leaves them running: `kill_tree` walks the tree with psutil instead.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch
from safetensors.torch import load_file

from tests.helpers import ROOT

# The environment and the tree kill live below both this module and tests.helpers.forked, which both use them.
from tests.helpers.processes import LAUNCHER_VARIABLES, VENV_BIN, env, kill_tree  # noqa: F401
from vitlarge.distributed.launcher import free_port  # noqa: F401 (launcher.free_port: the port for a rendezvous)

LAUNCHERS = ("python", "torchrun", "colossalai", "vitlarge", "fork", "single")
"""``launcher=``: one process without a launcher, torchrun, ``colossalai run``, ``python -m vitlarge.run``; or,
forked from the session's pre-imported server (`tests.helpers.forked`, for tests whose subject is not the
launcher): ranks with torchrun's variables (``fork``; the exit status is the one ``python -m vitlarge.run``
keeps), or one process without a launcher's variables, as ``python train.py`` (``single``)."""

DEFAULT = "fork"
"""The launcher of a test that names none: its subject is the run, not how it was started."""


def command(
    args: list[str],
    nproc: int = 1,
    launcher: str = "colossalai",
    script: tuple = ("train.py",),
    port: int | None = None,
) -> list[str]:
    """``script``: the entry point and its own arguments (tests/helpers/poison_train.py wraps train.py).
    ``port``: the launcher's --master_port (default: a free one)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher={launcher!r}: one of {LAUNCHERS}")
    if nproc == 1 and launcher == "python":
        return [sys.executable, *script, *args]
    if tuple(script) != ("train.py",):  # a wrapper would be silently dropped: the test would not test it
        raise ValueError(f"script={script} runs only with launcher='python' and nproc=1 (or through srun())")
    port = free_port() if port is None else port
    if launcher == "torchrun":
        return [f"{VENV_BIN}/torchrun", f"--nproc_per_node={nproc}", f"--master_port={port}", "train.py", *args]
    if launcher == "vitlarge":
        return [
            sys.executable,
            "-m",
            "vitlarge.run",
            f"--nproc_per_node={nproc}",
            f"--master_port={port}",
            "train.py",
            *args,
        ]
    return [
        f"{VENV_BIN}/colossalai",
        "run",
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(port),
        "train.py",
        *args,
    ]


def run(
    args: list[str],
    nproc: int = 1,
    launcher: str = DEFAULT,
    timeout: float = 600,
    script: tuple = ("train.py",),
    port: int | None = None,
    extra_env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Runs ``script`` (train.py or a wrapper of it) on ``nproc`` ranks; ``extra_env`` adds variables."""
    environment = {**env(), **(extra_env or {})}
    if launcher == "single":
        if nproc != 1:
            raise ValueError(f"launcher='single' is one process, not {nproc}")
        return python([*script, *args], timeout, environment=environment)
    if launcher == "fork":
        return _run_forked(args, nproc, timeout, script, port, environment)
    return subprocess.run(
        command(args, nproc, launcher, script, port),
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _run_forked(args, nproc, timeout, script, port, environment) -> subprocess.CompletedProcess:
    import tempfile

    from tests.helpers.forked import Job

    with tempfile.TemporaryDirectory(prefix="forked-") as d:
        out, err = Path(d, "stdout"), Path(d, "stderr")
        job = Job([*script, *args], nproc, environment, ROOT, out, err, free_port() if port is None else port)
        try:
            code = job.wait(timeout)
        finally:
            job.kill()  # what is left of it after a timeout or an error (ended ranks are not signalled)
        return subprocess.CompletedProcess(job.args, code, out.read_text(), err.read_text() if err.exists() else "")


def python(
    argv: list[str], timeout: float = 600, extra_env: dict | None = None, environment: dict | None = None
) -> subprocess.CompletedProcess:
    """``python *argv`` (a script or ``-m module`` and its arguments) in the repository, forked from the session's
    pre-imported server (`tests.helpers.forked`): for tests whose subject is the command, not a fresh interpreter.
    The environment is `env` plus ``extra_env``, or exactly ``environment``."""
    import tempfile

    from tests.helpers.forked import Rank

    with tempfile.TemporaryDirectory(prefix="forked-") as d:
        out, err = Path(d, "stdout"), Path(d, "stderr")
        proc = Rank(argv, {**env(), **(extra_env or {})} if environment is None else environment, ROOT, out, err)
        try:
            code = proc.wait(timeout)
        finally:
            if proc.poll() is None:  # a timeout or an error: it must not outlive the test
                kill_tree(proc)
        return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())


def start(
    args: list[str],
    nproc: int = 1,
    launcher: str = "colossalai",
    log: Path | None = None,
    extra_env: dict | None = None,
):
    """A running job: a `subprocess.Popen` in a session of its own, or a `tests.helpers.forked.Job` (the same
    ``poll``/``wait``/``returncode``; `kill_tree` takes either). ``extra_env`` adds variables."""
    environment = {**env(), **(extra_env or {})}
    if launcher == "fork":
        import tempfile

        from tests.helpers.forked import Job

        out = log or Path(tempfile.mkstemp(prefix="forked-")[1])
        return Job(["train.py", *args], nproc, environment, ROOT, out, out, free_port())
    out = open(log, "w") if log else subprocess.DEVNULL
    return subprocess.Popen(
        command(args, nproc, launcher),
        cwd=ROOT,
        env=environment,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def tree(pid) -> list[psutil.Process]:
    """A launcher (pid or `subprocess.Popen`) and every process under it, or a forked job's ranks and theirs."""
    if hasattr(pid, "ranks"):
        return [p for rank in pid.ranks for p in tree(rank.pid)]
    parent = psutil.Process(getattr(pid, "pid", pid))
    return parent.children(recursive=True) + [parent]


def workers(pid) -> list[psutil.Process]:
    """The train.py worker processes under a launcher (not the launcher, torchrun or a shell), or a forked
    job's ranks."""
    if hasattr(pid, "ranks"):
        return [psutil.Process(rank.pid) for rank in pid.ranks]
    pid = getattr(pid, "pid", pid)
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.NoSuchProcess:
            continue
        launchers = any(x.endswith(("torchrun", "colossalai")) or x in ("-c", "vitlarge.run") for x in cmd)
        if "train.py" in cmd and not launchers:
            found.append(p)
    return found


def wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None, poll: float = 0.05) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return predicate()
        time.sleep(poll)
    return False


def final_weights(workdir: Path) -> dict[str, torch.Tensor]:
    """The exported weights (``<workdir>/model/model.safetensors``) of a finished run."""
    from vitlarge.checkpoint.export import EXPORT_DIR

    return load_file(str(workdir / EXPORT_DIR / "model.safetensors"))


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"
