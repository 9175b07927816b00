"""`vitlarge.train.command.exit_status`: the one guard of train.py and vitlarge.evaluate: each way a command stops
is one line and its exit status, also recorded for torchrun's summary."""

from __future__ import annotations

import json

import pytest

from vitlarge.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_RENDEZVOUS, Preempted, RendezvousFailed, UserError
from vitlarge.events import StopTraining
from vitlarge.train.command import exit_status

LAUNCHERS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")


@pytest.fixture
def single(monkeypatch, tmp_path):
    """One process outside any launcher, torchrun's error file set: what the guard records is read back."""
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    return tmp_path / "error.json"


def raises(error: BaseException):
    def work(env) -> int:
        raise error

    return work


@pytest.mark.parametrize(
    ("error", "status", "line"),
    [
        (UserError("train.micro_batch=abc is not a number; give an integer"), 2, "error: train.micro_batch=abc"),
        (StopTraining("the loss was NaN for 3 steps"), 3, "error: the loss was NaN for 3 steps"),
        (Preempted(7, "runs/x/checkpoints/step_0000007"), EXIT_PREEMPTED, "vitlarge: stopped on signal after step 7"),
    ],
)
def test_each_stop_is_one_line_and_its_status(single, capsys, error, status, line):
    assert exit_status(raises(error)) == status
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(line), err
    recorded = json.loads(single.read_text())
    assert recorded["exit_status"] == status and recorded["message"]["message"] == err[0]


def test_a_rendezvous_that_timed_out_is_69_not_bad_input(single, capsys):
    """A rank whose master never starts (a peer pod still Pending, a slow image pull) stops with one line and
    `EXIT_RENDEZVOUS`, which a controller restarts, not 2, on which scripts/k8s/trainjob.yaml fails the job for good.
    The error is init_distributed's own (tests/unit/distributed/test_launch.py::test_rendezvous_nobody_listens makes
    it on a port nobody listens on); made here, since a group another test left in this process would keep
    init_distributed from trying."""
    from vitlarge.distributed.launcher import DistEnv, free_port
    from vitlarge.distributed.process import rendezvous_error

    env = DistEnv(1, 2, 1, "127.0.0.1", free_port(), "test")
    line = rendezvous_error(env, TimeoutError("1/2 clients joined"), 1.0, 1.0, "")
    assert exit_status(raises(RendezvousFailed(line))) == EXIT_RENDEZVOUS == 69
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: rendezvous at 127.0.0.1:{env.master_port} did not complete")
    assert json.loads(single.read_text())["exit_status"] == EXIT_RENDEZVOUS


def test_the_work_gets_this_processs_launcher_env_and_its_status_is_the_commands(single, capsys):
    seen = []
    assert exit_status(lambda env: seen.append(env) or 0) == 0
    assert [(e.rank, e.world_size, e.source) for e in seen] == [(0, 1, "single")]
    assert capsys.readouterr().err == "" and not single.exists()


def test_an_interrupt_is_130_and_any_other_error_propagates(single, monkeypatch):
    from vitlarge.distributed import launcher

    released = []
    monkeypatch.setattr(launcher, "release_colossalai_run_after_ctrl_c", lambda: released.append(1))
    assert exit_status(raises(Preempted(3, "ckpt", interrupted=True))) == EXIT_INTERRUPTED and released == [1]
    with pytest.raises(ValueError):
        exit_status(raises(ValueError("a bug: its traceback")))
