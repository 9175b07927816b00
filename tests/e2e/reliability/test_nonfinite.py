"""Non-finite values on real runs: an fp16 overflow is skipped, persistent divergence stops with exit 3.

Faults come from tests/helpers/poison_train.py, which wraps train.py's batch source: the poisoned steps'
images are inf on every rank. Single-process runs use micro batch 64 (accumulation 2) to stay fast; the
persistent case runs two ranks (srun-style) so that both are seen to stop, none left in a collective.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.runs import RECIPE, checkpoint_steps, kill_all, srun
from vitlarge.checkpoint import store
from vitlarge.checkpoint import weights as ckpt_weights
from vitlarge.checkpoint.state import RunState
from vitlarge.checkpoint.trust import layout

TIMEOUT = 600


def poison(steps: str) -> tuple:
    return ("tests/helpers/poison_train.py", steps)


def args(data: str, workdir: Path, *extra: str) -> list[str]:
    """fp16 unless ``extra`` says otherwise: the demo's ``auto`` would be fp32 on CPUs without fast fp16."""
    return [
        "--config",
        RECIPE,
        "--data",
        data,
        "--workdir",
        str(workdir),
        "train.log_every_steps=1",
        "train.precision=fp16",
        *extra,
    ]


def train_records(workdir: Path) -> dict[int, dict]:
    return {m["step"]: m for m in read_metrics(str(workdir / "metrics.jsonl")) if m["event"] == "train"}


def weights(path: Path) -> dict:
    """A checkpoint's full weights, read on this process (DCP's files)."""
    return ckpt_weights.weights_of(path, layout.read_meta(path))


def optimizer_state(path: Path) -> dict:
    """A checkpoint's whole optimizer state (DCP), by parameter name."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    from vitlarge.checkpoint.sharded import Reader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to load in a single process"
        return _load_state_dict_from_keys(storage_reader=Reader(path))["optimizer"]["state"]


def ckpt(workdir: Path, step: int) -> Path:
    return workdir / "checkpoints" / f"step_{step:07d}"


def test_one_poisoned_fp16_step_is_skipped_and_the_scale_halves(demo_data, tmp_path):
    r = launcher.run(
        args(
            demo_data,
            tmp_path,
            "train.max_steps=5",
            "train.micro_batch=64",
            "train.checkpoint_every_steps=1",
            "train.keep_checkpoints=10",
        ),
        launcher="single",
        timeout=TIMEOUT,
        script=poison("3"),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = train_records(tmp_path)
    assert [m[s]["skipped"] for s in range(1, 6)] == [False, False, True, False, False]
    assert m[3]["train_loss"] is None and m[3]["grad_norm"] is None  # nan, written as null
    assert [m[s]["loss_scale"] for s in range(1, 6)] == [2.0**16] * 3 + [2.0**15] * 2  # halved after the overflow
    lines = {int(x.split()[2].split("/")[0]): x for x in r.stdout.splitlines() if x.startswith("train step")}
    assert lines[3].endswith("skipped 1") and lines[4].endswith("skipped 0")

    # The skipped step changed neither the weights nor the optimizer state; the next one did.
    before, after, next_ = (weights(ckpt(tmp_path, s)) for s in (2, 3, 4))
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not all(torch.equal(after[k], next_[k]) for k in after)
    opt2, opt3 = (optimizer_state(ckpt(tmp_path, s)) for s in (2, 3))
    assert all(torch.equal(torch.as_tensor(opt2[p][k]), torch.as_tensor(opt3[p][k])) for p in opt2 for k in opt2[p])
    assert (tmp_path / "model" / "model.safetensors").is_file()


def test_persistent_nan_stops_both_ranks_with_exit_3_and_keeps_the_last_good_checkpoint(demo_data, tmp_path):
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    procs = srun(
        args(
            demo_data,
            tmp_path,
            "train.max_steps=30",
            "train.checkpoint_every_steps=3",
            "train.keep_checkpoints=10",
            "train.nan_patience=5",
        ),
        2,
        logs,
        script=poison("6-"),
    )
    try:
        codes = [p.wait(timeout=TIMEOUT) for p in procs]
    finally:
        kill_all(procs)
    log = logs[0].read_text()
    assert codes == [3, 3], log[-3000:]
    good = ckpt(tmp_path, 3)
    error = log.strip().splitlines()[-1]
    assert error.startswith("error: loss was non-finite for steps 6..10; last finite loss ")
    assert error.endswith(f"lower the lr or use bf16; last good checkpoint: {good}")
    assert "Traceback" not in log
    assert max(train_records(tmp_path)) == 10  # stopped at once, not at the end of the schedule
    assert not (tmp_path / "model").exists()
    assert checkpoint_steps(tmp_path) == [3, 6, 9]
    assert not list((tmp_path / "checkpoints").glob(".step_*"))

    # The named checkpoint is intact: it loads into a fresh model, optimizer and scaler, all finite.
    from vitlarge.config.load import load_config
    from vitlarge.model.vit import build_model
    from vitlarge.optim.lamb import build_optimizer

    cfg = load_config(RECIPE, [], data__path=demo_data)
    torch.manual_seed(123)
    model = build_model(cfg, torch.device("cpu"))
    opt = build_optimizer(model, cfg.optim)
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    state = store.load(good, RunState(model, opt, scaler), cfg)
    assert state.step == 3 and state.world_size == 2
    saved = weights(good)
    for k, v in model.state_dict().items():
        assert torch.isfinite(v).all(), k
        assert torch.equal(v, saved[k]), k
    for s in opt.state_dict()["state"].values():
        assert all(torch.isfinite(torch.as_tensor(x)).all() for x in s.values())
    assert math.isfinite(scaler.get_scale())


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_huge_lr_without_loss_scaling_stops_with_exit_3(demo_data, tmp_path, precision):
    """lr 1e6: after one update the loss is a finite ~1e8 but every gradient is nan, so every later step
    is skipped. Without a loss scaler nothing can recover from that; the guard counts those steps
    (before the fix the run skipped all its steps and exited 0 with the weights of step 1)."""
    r = launcher.run(
        args(
            demo_data,
            tmp_path,
            "train.max_steps=30",
            "train.micro_batch=64",
            "optim.lr=1e6",
            f"train.precision={precision}",
        ),
        launcher="single",
        timeout=TIMEOUT,
    )
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("error: loss or gradients were non-finite for steps "), error
    assert "lower the lr;" in error and "last good checkpoint: none" in error
    m = train_records(tmp_path)
    last = max(m)
    assert last < 30 and all(m[s]["skipped"] for s in range(last - 4, last + 1))  # patience 5, then stop
    assert not (tmp_path / "model").exists()
