"""vitlarge/distributed/timeouts.py in one process: the group's timeout as train.py sets and lowers it, and which
errors are a collective's. A real timeout needs two processes: tests/e2e/test_collective_timeout.py stalls one."""

import datetime

import pytest
import torch
import torch.distributed as dist

from tests.helpers.process_group import single_process_group
from vitlarge.config.schema import TrainConfig
from vitlarge.distributed import timeouts
from vitlarge.distributed.launcher import DistEnv, free_port
from vitlarge.distributed.process import init_distributed, rendezvous_timeout_s


def group_timeout() -> datetime.timedelta:
    return dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout


def test_defaults_leave_a_first_run_time_to_compile():
    t = TrainConfig()
    assert (t.init_timeout_s, t.collective_timeout_s) == (1800, 600)


def test_the_group_starts_with_the_init_timeout_and_is_lowered_in_place():
    if dist.is_initialized():  # an in-process test before this one left its group
        dist.destroy_process_group()
    init_distributed(DistEnv(0, 1, 0, "127.0.0.1", free_port(), "single"), "gloo", collective_timeout_s=1800)
    try:
        assert group_timeout() == datetime.timedelta(seconds=1800)
        timeouts.set_collective_timeout(600)
        assert group_timeout() == datetime.timedelta(seconds=600)
        dist.all_reduce(torch.ones(1))  # the group still works
    finally:
        dist.destroy_process_group()


def test_evaluations_and_checkpoints_wait_the_init_timeout_and_a_failure_keeps_it():
    """`Trainer._slow_collectives` (around every evaluation and checkpoint): the group waits train.init_timeout_s
    inside, train.collective_timeout_s after; when a collective in it fails, the timeout stays what it waited, so
    the error line (`collective_failure` reads it) says the wait and the setting that applied."""
    from types import SimpleNamespace

    from vitlarge.train.loop import Trainer

    if dist.is_initialized():
        dist.destroy_process_group()
    init_distributed(DistEnv(0, 1, 0, "127.0.0.1", free_port(), "single"), "gloo", collective_timeout_s=1800)
    trainer = SimpleNamespace(cfg=SimpleNamespace(train=TrainConfig(init_timeout_s=1200, collective_timeout_s=300)))
    try:
        timeouts.set_collective_timeout(300)
        with Trainer._slow_collectives(trainer):
            assert group_timeout() == datetime.timedelta(seconds=1200)
        assert group_timeout() == datetime.timedelta(seconds=300)
        with pytest.raises(RuntimeError), Trainer._slow_collectives(trainer):
            raise RuntimeError("Timed out waiting 1200000ms for recv operation to complete")
        assert group_timeout() == datetime.timedelta(seconds=1200) and timeouts._timeout_s[0] == 1200
    finally:
        dist.destroy_process_group()


def test_rendezvous_waits_the_init_timeout_unless_the_variable_says_otherwise():
    """VITLARGE_RENDEZVOUS_TIMEOUT, kept for jobs (and tests) that bound the rendezvous alone, wins over the default
    train.py passes (train.init_timeout_s)."""
    assert rendezvous_timeout_s({}, default=1800) == 1800
    assert rendezvous_timeout_s({"VITLARGE_RENDEZVOUS_TIMEOUT": "5"}, default=1800) == 5


@pytest.mark.parametrize("grouped", [False, True])
def test_other_errors_are_not_a_collectives(grouped):
    """A CUDA error or a bug keeps its traceback (train.py's status 1): only gloo's timeout and lost-peer errors
    become one line."""
    errors = [RuntimeError("CUDA error: an illegal memory access was encountered"), ValueError("Timed out waiting")]
    if grouped:
        with single_process_group():
            assert [timeouts.collective_failure(e) for e in errors] == [None, None]
    else:
        if dist.is_initialized():
            dist.destroy_process_group()
        assert [timeouts.collective_failure(e) for e in errors] == [None, None]


def test_the_collective_is_named_from_the_traceback():
    """torch.distributed's function the run called, read from a real error's traceback (here a bad argument: the
    frames are the same as a timeout's)."""
    with single_process_group():
        with pytest.raises(Exception) as raised:  # noqa: PT011 - whatever torch raises, its frames are the point
            dist.all_reduce([torch.ones(1)])
    assert timeouts.operation(raised.value) == "all_reduce"
    assert timeouts.operation(RuntimeError("no traceback")) == "a collective"
