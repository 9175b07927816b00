"""A gloo process group of one in this process, as train.py makes it (`vitlarge.distributed.process.init_distributed`).

In-process tests of code that needs torch.distributed (the Booster, FSDP, collectives, the sharded
optimizer and checkpoints) share one group per module. A group an earlier in-process test left
(benchmarks make one) is reused and left in place; one made here is destroyed at the end.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch.distributed as dist

from vitlarge.distributed.launcher import DistEnv, free_port
from vitlarge.distributed.process import init_distributed


@contextmanager
def single_process_group():
    """A gloo group of world size 1 for the ``with`` block (or the one already there)."""
    ours = not dist.is_initialized()
    if ours:
        init_distributed(DistEnv(0, 1, 0, "127.0.0.1", free_port(), "single"), "gloo")
    assert dist.get_world_size() == 1
    try:
        yield
    finally:
        if ours:
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def process_group():
    """A gloo group of one for the module's tests (request it, or import it with ``autouse`` wrappers)."""
    with single_process_group():
        yield


def init_rank(rank: int, world: int, port: int, **kwargs) -> None:
    """In a spawned worker: joins the ``world``-rank gloo group at 127.0.0.1:``port`` as train.py does."""
    init_distributed(DistEnv(rank, world, rank, "127.0.0.1", port, "spawn"), "gloo", **kwargs)
