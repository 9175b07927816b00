"""train.ema_decay end to end: real 2-rank demo runs (forked ranks, tests/helpers/forked.py) (gloo, DALI), ddp and fsdp.

Each plugin: one uninterrupted 12-step run with the EMA (evaluations at steps 6 and 12), and one killed with
kill -9 after its step-8 checkpoint, then the same command: the resumed run ends with bitwise the same weights
and bitwise the same EMA (read from the final checkpoint). The fsdp runs export the EMA (``train.export_ema``);
``ddp-deit3`` adds every other DeiT III piece (BCE, repeats 3, 3-Augment, simple random crop, random erasing).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.launcher import assert_bitwise_equal, final_weights
from tests.helpers.runs import REFERENCE_STEPS, metrics_has_step, train_args
from vitlarge.checkpoint.sharded import read_full_model
from vitlarge.checkpoint.store import step_name

EMA = ["train.ema_decay=0.99", "train.eval_every_epochs=0.5"]  # 11 steps per epoch: evaluations at 6 and 12
# Every DeiT III piece with it (the demo command of the README): the records read by index in the repeats
# stream, 3-Augment, the simple random crop, random erasing and BCE must resume as bitwise as the EMA.
DEIT3 = ["augment.loss=bce", "data.repeats=3", "data.three_augment=true", "data.crop=src"]
DEIT3 += ["augment.random_erase_prob=0.25"]
PLUGINS = {
    "ddp": ["train.plugin=ddp", "train.ema_warmup=true"],
    "fsdp": ["train.plugin=fsdp", "train.export_ema=true"],
    "ddp-deit3": ["train.plugin=ddp", *DEIT3],
}


def args(demo_data: str, workdir: Path, plugin: str) -> list[str]:
    return train_args(demo_data, workdir, *EMA, *PLUGINS[plugin])


def final_ema(workdir: Path) -> dict:
    return read_full_model(workdir / "checkpoints" / step_name(REFERENCE_STEPS), key="ema")


@pytest.fixture(scope="module")
def reference(demo_data, tmp_path_factory) -> dict:
    out = {}
    for plugin in PLUGINS:
        workdir = tmp_path_factory.mktemp(f"ema_{plugin}")
        r = launcher.run(args(demo_data, workdir, plugin), nproc=2)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        out[plugin] = (workdir, r.stdout + r.stderr)
    return out


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_each_evaluation_logs_the_raw_and_the_ema_top1(reference, plugin):
    workdir, log = reference[plugin]
    evals = [r for r in read_metrics(str(workdir / "metrics.jsonl")) if r["event"] == "eval"]
    assert [e["step"] for e in evals] == [6, 12]
    for e in evals:
        assert all(0 <= e[k] <= 1 for k in ("val_top1", "val_top5", "val_top1_ema", "val_top5_ema")), e
        assert e["val_loss_ema"] > 0 and e["val_loss_ema"] != e["val_loss"], e  # another model was evaluated
    end = next(r for r in read_metrics(str(workdir / "metrics.jsonl")) if r["event"] == "end")
    assert end["val_top1_ema"] == evals[-1]["val_top1_ema"]
    lines = [x for x in log.splitlines() if x.startswith("eval  step")]
    assert len(lines) == 2 and all(" | top-1 " in x and " | ema top-1 " in x for x in lines), lines
    last = evals[-1]
    assert f"top-1 {100 * last['val_top1']:.2f}%" in lines[-1]
    assert f"ema top-1 {100 * last['val_top1_ema']:.2f}%" in lines[-1]
    assert (workdir / "metrics.png").is_file()
    meta = json.loads((workdir / "checkpoints" / step_name(REFERENCE_STEPS) / "meta.json").read_text())
    assert meta["ema"] is True
    ema, raw = final_ema(workdir), final_weights(workdir) if plugin.startswith("ddp") else None
    if raw is not None:
        assert ema.keys() == raw.keys() and any(not (ema[k] == raw[k]).all() for k in raw)


def test_the_fsdp_export_holds_the_ema_and_says_so(reference):
    import timm

    workdir, _ = reference["fsdp"]
    exported = final_weights(workdir)
    assert_bitwise_equal(exported, final_ema(workdir))
    assert json.loads((workdir / "model" / "config.json").read_text())["vitlarge_weights"] == "ema"
    with safe_open(str(workdir / "model" / "model.safetensors"), "pt") as f:
        assert f.metadata()["weights"] == "ema"
    model = timm.create_model(f"local-dir:{workdir / 'model'}", pretrained=True)
    assert_bitwise_equal(dict(model.state_dict()), exported)


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_kill_9_then_the_same_command_ends_with_bitwise_the_same_weights_and_ema(
    reference, demo_data, tmp_path, plugin
):
    run_args = args(demo_data, tmp_path, plugin)
    proc = launcher.start(run_args, nproc=2, launcher="fork", log=tmp_path / "killed.log")
    try:
        assert launcher.wait_for(metrics_has_step(tmp_path, 9), 600, proc), (tmp_path / "killed.log").read_text()[
            -3000:
        ]
    finally:
        launcher.kill_tree(proc)  # SIGKILL, both ranks
        proc.wait(timeout=60)
    r = launcher.run(run_args, nproc=2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"resumed from {tmp_path / 'checkpoints' / step_name(8)} at step 8" in r.stdout + r.stderr
    assert "holds no model EMA" not in r.stdout + r.stderr
    workdir, _ = reference[plugin]
    assert_bitwise_equal(final_weights(tmp_path), final_weights(workdir))
    assert_bitwise_equal(final_ema(tmp_path), final_ema(workdir))


def test_a_checkpoint_without_an_ema_resumes_with_the_average_started_from_its_weights(demo_data, tmp_path):
    """A run written before the EMA existed (or with it off), continued with train.ema_decay: one warning line,
    the average starts from the resumed weights, and the next checkpoints hold it."""
    plain = train_args(demo_data, tmp_path, "train.max_steps=2", "train.checkpoint_every_steps=2")
    r = launcher.run(plain, nproc=2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = launcher.run([*plain, *EMA, "train.max_steps=4"], nproc=2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert "at step 2" in log and log.count("holds no model EMA") == 1, log[-3000:]
    last = tmp_path / "checkpoints" / step_name(4)
    assert json.loads((last / "meta.json").read_text())["ema"] is True
    ema = read_full_model(last, key="ema")
    assert ema.keys() == final_weights(tmp_path).keys()
