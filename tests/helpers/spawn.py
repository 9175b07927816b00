"""N gloo worker processes in one call: torch.multiprocessing's spawn, bounded by a deadline.

The worker is ``fn(rank, *args)``, a module-level function (spawn pickles it by name); it joins the
group itself (`tests.helpers.process_group.init_rank`). A worker that raises fails the test with its
traceback; a job still running at the deadline is killed and fails the test with ``what``: a rank
waiting in a collective no other rank joins would otherwise hang the suite.
"""

from __future__ import annotations

import time

import pytest
import torch.multiprocessing as mp

from vitlarge.distributed.launcher import free_port


def spawn(fn, nprocs: int, *args, timeout: float = 600, what: str = "the spawned job") -> None:
    """Runs ``fn(rank, *args)`` in ``nprocs`` fresh processes and waits for all of them."""
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{what} did not finish in {timeout:.0f} s")


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
