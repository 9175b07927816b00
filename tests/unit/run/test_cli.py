"""The training command's start, in process: what it checks before 10-20 s of imports and the rendezvous."""

from __future__ import annotations

import pytest

from tests.helpers import ROOT
from vitlarge.distributed.launcher import DistEnv
from vitlarge.distributed.threads import NO_THREADS
from vitlarge.errors import UserError
from vitlarge.run import cli

ONE_PROCESS = DistEnv(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=29500, source="none")


def test_a_run_whose_data_is_not_there_is_one_line_before_pytorch_loads(tmp_path, capsys):
    """No hooks are handed in: a run that went past the check would stop at them (TypeError), having said
    "loading PyTorch and Colossal-AI" first."""
    missing = tmp_path / "digits"
    args = cli.parse_args(
        ["--config", str(ROOT / "recipes" / "demo_digits.py"), "--data", str(missing), "train.seed=1"]
    )
    with pytest.raises(UserError) as e:
        cli.plan_or_train(args, ONE_PROCESS, NO_THREADS)
    assert str(e.value) == (
        f"{missing}: data directory does not exist; the demo's digits data set is made with python -m "
        f"data_tools.make_demo_dataset {missing} (a few seconds); for other images convert with python -m "
        "data_tools.imagenet_to_tfrecord"
    )
    assert capsys.readouterr().out == ""
