"""Sharded LAMB (vitlarge/optim/sharded_lamb.py) at 2 and 3 gloo ranks: the same update as unsharded LAMB.

FSDP2 shards every tensor's rows unevenly here (1 to 5 rows over 2 or 3 ranks; some ranks hold none
of a tensor), so a trust ratio computed from this rank's rows alone, or an all-reduce that missed a
rank, gives another update. Each rank compares the gathered sharded parameters with an unsharded
copy stepped by `Lamb` (tests/helpers/lamb_parity.py), for each of LAMB's forms (``optim.implementation``; the
compiled one's two passes run uncompiled); the one-rank checks are in tests/unit/optim/test_sharded_lamb.py.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.spawn import exit_worker, free_port, spawn


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from tests.helpers.lamb_parity import parity, uncompiled
    from tests.helpers.process_group import init_rank
    from vitlarge.optim import lamb

    torch.set_num_threads(1)
    init_rank(rank, world, port)
    lamb.compiled_passes = uncompiled  # the compiled form's arithmetic and all-reduce, not Inductor's minute here
    diffs = {form: parity(steps=3, implementation=form) for form in ("chunked", "foreach", "compiled")}
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(diffs, f)
    dist.destroy_process_group()
    exit_worker()


@pytest.mark.parametrize("world", [2, 3])
def test_uneven_shards_step_exactly_as_unsharded_lamb(world, tmp_path):
    spawn(_worker, world, world, free_port(), str(tmp_path), timeout=300, what=f"the {world}-rank sharded LAMB job")
    for rank in range(world):
        for form, diffs in json.loads((tmp_path / f"rank{rank}.json").read_text()).items():
            assert len(diffs) == 3 and len(diffs[0]) == 8
            assert all(d < 1e-6 for step in diffs for d in step.values()), (rank, form, diffs)
