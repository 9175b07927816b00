"""Shared decisions (vitlarge/distributed/collective.py) across 3 gloo processes: what every rank sees.

One spawn of 3 ranks runs every case and records what each rank got; each test asserts one claim.
Rank 0 decides and every rank returns its answer (the others never run the decision); a UserError
on rank 0 is the same UserError everywhere; any other failure on rank 0 is raised there and the
others end with a one-line UserError pointing to it; every rank reports and all see the lowest
failing rank. The one-process behaviour is in tests/unit/distributed/test_collective.py.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.spawn import exit_worker, free_port, spawn

WORLD = 3


def _outcome(fn) -> dict:
    try:
        return {"value": fn()}
    except Exception as e:  # noqa: BLE001 - recorded for the test to assert on
        return {"error": type(e).__name__, "message": str(e)}


def _worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from tests.helpers.process_group import init_rank
    from vitlarge.distributed.collective import first_failure, gather, rank0_decides, rank_and_world
    from vitlarge.errors import UserError

    init_rank(rank, WORLD, port)
    ran = []

    def decide():
        ran.append(rank)
        return {"decided_on": rank}

    def user_error():
        raise UserError("no checkpoint in runs/x")

    def bug():
        raise RuntimeError("meta.json vanished\nsecond line")

    found = {
        "rank_and_world": list(rank_and_world()),
        "decided": _outcome(lambda: rank0_decides(decide)),
        "ran": ran,
        "user_error": _outcome(lambda: rank0_decides(user_error)),
        "bug": _outcome(lambda: rank0_decides(bug)),
        "gather": gather(rank * 10),
        "first_failure": first_failure(None if rank == 0 else f"rank {rank} failed"),
        "no_failure": first_failure(None),
    }
    dist.barrier()  # every rank is still in step after the failures above: nobody hung
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(found, f)
    dist.destroy_process_group()
    exit_worker()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("collective")
    spawn(_worker, WORLD, free_port(), str(out), timeout=300, what="the 3-rank collective job (a rank hung?)")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_every_rank_knows_its_rank_and_the_world(ranks):
    assert [r["rank_and_world"] for r in ranks] == [[0, 3], [1, 3], [2, 3]]


def test_rank_0_decides_alone_and_every_rank_returns_its_answer(ranks):
    assert [r["decided"] for r in ranks] == [{"value": {"decided_on": 0}}] * WORLD
    assert [r["ran"] for r in ranks] == [[0], [], []]


def test_a_user_error_on_rank_0_is_the_same_user_error_everywhere(ranks):
    assert [r["user_error"] for r in ranks] == [{"error": "UserError", "message": "no checkpoint in runs/x"}] * WORLD


def test_another_failure_on_rank_0_is_raised_there_and_named_in_one_line_elsewhere(ranks):
    assert ranks[0]["bug"] == {"error": "RuntimeError", "message": "meta.json vanished\nsecond line"}
    for r in ranks[1:]:
        assert r["bug"] == {
            "error": "UserError",
            "message": "rank 0 failed (RuntimeError: meta.json vanished); see its traceback",
        }


def test_gather_and_first_failure_are_the_same_on_every_rank(ranks):
    assert [r["gather"] for r in ranks] == [[0, 10, 20]] * WORLD
    assert [r["first_failure"] for r in ranks] == [[1, "rank 1 failed"]] * WORLD  # the lowest failing rank
    assert [r["no_failure"] for r in ranks] == [None] * WORLD
