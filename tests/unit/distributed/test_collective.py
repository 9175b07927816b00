"""Shared decisions (vitlarge/distributed/collective.py) in one process: without a process group and in a gloo group of one.

Every function must work without a process group (plain ``python train.py``, evaluate, tools) and
take the one-process shortcut in a group of one (no collective runs). The 3-rank behaviour (rank 0
decides, every rank hears of a failure) is in tests/e2e/test_collective.py.
"""

import pytest
import torch.distributed as dist

from tests.helpers.process_group import single_process_group
from vitlarge.distributed.collective import first_failure, gather, rank0_decides, rank_and_world
from vitlarge.errors import UserError


@pytest.fixture(params=["no group", "group of one"])
def one_process(request):
    if request.param == "no group":
        if dist.is_initialized():  # an in-process test before this one (the benchmarks' suite) left its group
            dist.destroy_process_group()
        yield
    else:
        with single_process_group():
            yield


def test_rank_and_world_of_one_process(one_process):
    assert rank_and_world() == (0, 1)


def test_rank0_decides_runs_the_decision_once_and_returns_it(one_process):
    calls = []
    assert rank0_decides(lambda: calls.append(1) or {"step": 8}) == {"step": 8}
    assert calls == [1]


def test_rank0_decides_raises_the_decisions_own_error(one_process):
    def user_error():
        raise UserError("no checkpoint in runs/x")

    def bug():
        raise KeyError("meta")

    with pytest.raises(UserError, match="^no checkpoint in runs/x$"):
        rank0_decides(user_error)
    with pytest.raises(KeyError):  # not turned into a UserError: its traceback is the one to read
        rank0_decides(bug)


def test_gather_and_first_failure_of_one_process(one_process):
    assert gather({"a": 1}) == [{"a": 1}]
    assert first_failure(None) is None
    assert first_failure("disk full") == (0, "disk full")
