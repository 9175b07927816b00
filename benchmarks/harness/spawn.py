"""Spawn-and-gather: N real gloo processes on this machine, each returning a JSON-able result.

Contract: ``spawn_gather(fn, world, *args)`` starts ``world`` processes (``torch.multiprocessing``,
1 torch thread each), joins them to one gloo group and calls ``fn(rank, world, *args)`` in each; the
values they return come back as a list indexed by rank (``dist.all_gather_object``, written by rank
0). ``fn`` must be a module-level function (it is pickled into the new processes). The group is set
up by `vitlarge.distributed.process.init_distributed`, as train.py does, or, with ``plain_init=True``, by
``torch.distributed`` alone (for a worker that imports another checkout's vitlarge first).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def spawn_gather(fn: Callable, world: int, *args, plain_init: bool = False) -> list:
    import torch.multiprocessing as mp

    from vitlarge.distributed.launcher import free_port

    out = tempfile.mktemp(prefix="vitlarge-bench-", suffix=".json")
    mp.spawn(_entry, args=(fn, world, free_port(), plain_init, args, out), nprocs=world, join=True)
    try:
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)


def _entry(rank: int, fn: Callable, world: int, port: int, plain_init: bool, args: tuple, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if plain_init:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    else:
        from vitlarge.distributed import launcher, process

        process.init_distributed(launcher.DistEnv(rank, world, rank, "127.0.0.1", port, "bench"), "gloo")
    result = fn(rank, world, *args)
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()
    # Leave at once: left to the interpreter's shutdown, gloo's objects are destroyed after a peer
    # (rank 0 hosts the store) closed its sockets, and a background thread's end can abort with
    # SIGABRT under load (CI, stop 27). tests/helpers/spawn.exit_worker does the same for tests.
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def init_single_process_group() -> None:
    """gloo, world size 1, through vitlarge.distributed.process as train.py does (no-op if already initialised)."""
    import torch.distributed as dist

    from vitlarge.distributed import launcher, process

    if not dist.is_initialized():
        env = launcher.DistEnv(0, 1, 0, "127.0.0.1", launcher.free_port(), "single")
        process.init_distributed(env, "gloo")
