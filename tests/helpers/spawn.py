"""N gloo worker processes in one call, bounded by a deadline.

The worker is ``fn(rank, *args)``, a module-level function (pickled by name); it joins the group itself
(`tests.helpers.process_group.init_rank`). The processes are forked from the session's pre-imported
forkserver (`tests.helpers.forked`: torch, DALI, Colossal-AI and vitlarge already loaded, where a spawned
interpreter pays about 11 s of imports on 2 CPU cores), with the test process's environment at the call. A worker that raises fails the test with its
traceback; a job still running at the deadline is killed and fails the test with ``what``: a rank
waiting in a collective no other rank joins would otherwise hang the suite.
"""

from __future__ import annotations

import os
import time

import pytest
import torch.multiprocessing as mp

from tests.helpers import forked
from vitlarge.distributed.launcher import free_port


def spawn(fn, nprocs: int, *args, timeout: float = 600, what: str = "the spawned job") -> None:
    """Runs ``fn(rank, *args)`` in ``nprocs`` fresh processes and waits for all of them."""
    forked.context()  # the server with its preload, before torch.multiprocessing asks for the forkserver
    ctx = mp.start_processes(
        _in_environment, args=(dict(os.environ), fn, *args), nprocs=nprocs, join=False, start_method="forkserver"
    )
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{what} did not finish in {timeout:.0f} s")


def _in_environment(rank: int, environment: dict, fn, *args) -> None:
    os.environ.clear()
    os.environ.update(environment)
    fn(rank, *args)


def exit_worker() -> None:
    """A worker's last line, after ``destroy_process_group``: leaves at once with status 0. Left to the
    interpreter's shutdown, the gloo group and store objects are destroyed while a peer that exited
    first (rank 0 hosts the store) has closed its sockets, and a background thread's end can abort the
    process ("terminate called without an active exception", SIGABRT) under load."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


__all__ = ["exit_worker", "free_port", "spawn"]
