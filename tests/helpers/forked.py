"""Ranks forked from a pre-imported parent: torchrun's environment without a launcher's start-up cost.

Each rank that ``colossalai run`` or torchrun starts imports torch, timm, DALI and Colossal-AI afresh:
about 11 s of CPU on the 2-core test machine (AMD EPYC), most of a 12-step test run, paid twice per run
and several runs per test. Tests whose subject is not the launcher start their ranks here instead
(``launcher="fork"`` in `tests.helpers.launcher`, ``fork=True`` in `tests.helpers.runs.srun`): one
multiprocessing forkserver per test session imports those modules once (`PRELOAD`, about 11 s, paid
once), then forks every rank from that pre-imported state. A rank gets a fresh environment (the one the
test passes, with the variables torchrun or srun would set), a working directory, its own stdout and stderr
files, and runs ``train.py``'s ``console()`` (or another entry point) as ``python train.py`` would, exit
status included: it is a real process, joins a real gloo group, and is signalled and killed by pid.

What a forked rank does not re-read: whatever the preloaded modules read from the environment at import
(``PYTHONWARNINGS``, ``OMP_NUM_THREADS`` for OpenMP's pool, ``TORCHINDUCTOR_*``). The server starts with the
tests' launcher environment (`tests.helpers.processes.env`); a test that varies those variables, or whose
subject is a launcher (its exit status, its output, its signals), starts real processes.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PRELOAD = ["tests.helpers.forked_preload"]

_context = None
_live: set = set()  # ranks started and not yet reaped: killed when the session ends (`kill_live`)


def context():
    """The session's forkserver context. The first call starts the server with the tests' launcher environment
    (`tests.helpers.processes.env`, captured then: PYTHONWARNINGS's errors, OMP_NUM_THREADS=1), waits for its
    preload, and raises with the preload's own traceback if it failed (multiprocessing's forkserver would swallow
    an ImportError and leave every rank to import on its own, green but slow)."""
    global _context
    if _context is None:
        from tests.helpers import processes

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        saved, server_env = dict(os.environ), processes.env()
        os.environ.clear()
        os.environ.update(server_env)
        try:
            from multiprocessing import forkserver

            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _context = ctx
        _check_preload(ctx)
    return _context


def _preload_report(path: str) -> None:
    """In a forked process: what the server's preload left (its error, or nothing)."""
    import tests.helpers.forked_preload as preload

    Path(path).write_text(preload.ERROR or ("" if preload.READY else "the preload did not run to its end"))


def _check_preload(ctx) -> None:
    import tempfile

    with tempfile.NamedTemporaryFile("r", prefix="forked-preload-") as f:
        probe = ctx.Process(target=_preload_report, args=(f.name,))
        probe.start()
        probe.join(600)
        problem = f.read() if probe.exitcode == 0 else f"the probe exited with {probe.exitcode}"
    if problem:
        raise RuntimeError(f"tests/helpers/forked_preload.py failed in the forkserver:\n{problem}")


def kill_live() -> None:
    """SIGKILLs every forked rank still running (and what it started): at the session's end, so that a test that
    failed or timed out leaves nothing behind for the next tests, nor for multiprocessing's exit to wait on."""
    from tests.helpers.processes import kill_tree

    for rank in list(_live):
        if rank.poll() is None:
            kill_tree(rank.pid)
            rank.poll()


def _rank_main(argv: list[str], env: dict, cwd: str, out: str, err: str, delay_s: float = 0.0) -> None:
    """A forked rank: ``python <argv>`` with ``env`` in ``cwd``, stdout/stderr appended to ``out``/``err``, after
    ``delay_s`` seconds (a stand-in for a real rank's imports, where a test needs their timing)."""
    time.sleep(delay_s)
    os.setsid()  # a session of its own, as the launchers' and srun's tasks have: a group signal stays inside
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # Fresh seeds, as a new interpreter draws them (Python's `random` reseeds itself at fork): ranks and runs must
    # not agree by inheritance. (The string hash seed cannot change after the interpreter starts: the tests that
    # check ranks agree across distinct hash seeds are the real launchers', tests/README.md.)
    import numpy
    import torch

    numpy.random.seed()
    torch.seed()
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)
    # Each line reaches the file when it ends, in one write (tests poll logs): ranks share a log, and print()'s text
    # and newline written separately could put another rank's line between them.
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), line_buffering=True)
    sys.argv = list(argv)
    code = 1
    try:
        if argv[0] == "-m":
            import runpy

            sys.argv = [argv[1], *argv[2:]]
            sys.modules.pop(argv[1], None)  # preloaded: run it afresh as __main__, as `python -m` does
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            import runpy

            sys.path.insert(0, str(Path(cwd, argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        import atexit

        atexit._run_exitfuncs()  # what the interpreter's exit would run; multiprocessing leaves by os._exit
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


class Rank:
    """One forked rank, with the part of `subprocess.Popen`'s interface the tests use."""

    def __init__(
        self, argv: list[str], env: dict, cwd: str | Path, out: Path, err: Path | None = None, delay_s: float = 0.0
    ):
        self.args = argv
        self._process = context().Process(
            target=_rank_main,
            args=(list(argv), dict(env), str(cwd), str(out), str(err or out), delay_s),
            daemon=False,
        )
        self._process.start()
        self.pid = self._process.pid
        self.returncode: int | None = None
        _live.add(self)

    def poll(self) -> int | None:
        if self.returncode is None and not self._process.is_alive():
            self._process.join()
            self.returncode = self._process.exitcode
            _live.discard(self)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


TERM_AFTER_S = 5.0
KILL_AFTER_S = 30.0
"""After the first rank fails, the others get SIGTERM after `TERM_AFTER_S` and SIGKILL after `KILL_AFTER_S`, as
torchrun stops the rest of a failed group (it sends SIGTERM at once: the grace here leaves vitlarge's ranks the
seconds they take to agree on an error and end by themselves, which is what the tests check)."""


class Job:
    """N ranks with torchrun's variables; ends with the status ``python -m vitlarge.run`` keeps: 0 when every
    rank ended with 0, else the first failure's (a rank ended by signal N counts as 128 + N)."""

    def __init__(self, argv: list[str], nproc: int, env: dict, cwd: str | Path, out: Path, err: Path, port: int):
        self.args = argv
        self.ranks = []
        try:
            for rank in range(nproc):
                e = dict(env)
                e.update(
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE=str(nproc),
                    LOCAL_WORLD_SIZE=str(nproc),
                    GROUP_RANK="0",
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                )
                self.ranks.append(Rank(argv, e, cwd, out, err))
        except BaseException:
            self.kill()  # the ranks already started would wait for the missing one until their rendezvous timeout
            raise
        # No ``pid``: a job is several processes. `tests.helpers.processes.kill_tree` and ``workers`` take the job.
        self.returncode: int | None = None
        self._failed_at: float | None = None
        self._first_failure: int | None = None
        self._termed = False

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        codes = [r.poll() for r in self.ranks]
        for c in codes:
            if c not in (None, 0) and self._first_failure is None:
                self._first_failure = 128 - c if c < 0 else c
                self._failed_at = time.monotonic()
        if None in codes:
            since = None if self._failed_at is None else time.monotonic() - self._failed_at
            if since is not None and since > KILL_AFTER_S:
                self.kill()
            elif since is not None and since > TERM_AFTER_S and not self._termed:
                self._termed = True
                self.terminate()
            return None
        self.returncode = self._first_failure or 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        for r in self.ranks:
            r.send_signal(sig)

    def kill(self) -> None:
        from tests.helpers.processes import kill_tree

        kill_tree(self)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)
