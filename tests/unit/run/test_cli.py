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


def test_help_lists_every_config_key_with_its_docstring_and_loads_no_torch(monkeypatch, capsys):
    """``train.py --help``: the flags, then each section of the schema with its keys, each key's default and its
    docstring (as declared in vitlarge/config/schema.py); imported afresh with torch, DALI and Colossal-AI made
    unimportable, so the help that lists them never loads them."""
    import dataclasses
    import sys

    from vitlarge.config.overrides import all_keys
    from vitlarge.config.schema import Config

    for name in [m for m in sys.modules if m.split(".")[0] in ("vitlarge", "hooks", "torch", "nvidia", "colossalai")]:
        monkeypatch.delitem(sys.modules, name)
    for name in ("torch", "nvidia", "nvidia.dali", "colossalai"):
        monkeypatch.setitem(sys.modules, name, None)  # `import torch` raises ImportError
    from vitlarge.run import cli as fresh

    with pytest.raises(SystemExit) as e:
        fresh.parse_args(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--config" in out
    lines = out.splitlines()
    keys = {line.split(" = ")[0].strip() for line in lines if " = " in line and line.startswith("  ") and "." in line}
    assert keys >= set(all_keys(Config())) - {"workdir"} and any(line.startswith("  workdir = ") for line in lines)
    sections = [f.name for f in dataclasses.fields(Config) if f.name != "workdir"]
    assert all(any(line.startswith(f"{s}: ") for line in lines) for s in sections)
    text = " ".join(out.split())
    assert (
        "model.drop_path_schedule = linear (one of linear, uniform) linear: timm's spread, block i of n drops with"
        in text
    )
    assert "train.seed = 42 Initial weights (same on every rank)" in text
    assert "optim: Optimizer, its parameter groups" in text
