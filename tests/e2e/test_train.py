"""train.py end to end: real processes (forked ranks with torchrun's variables, tests/helpers/forked.py) with gloo, real DALI, the demo recipe.

The runs are short (a few optimizer steps of the 0.45M-parameter demo ViT) but go through every
part: Booster + TorchDDPPlugin, 4 accumulation micro-steps under no_sync, the precision `auto` picks
for this CPU (fp16 with dynamic loss scaling end to end: tests/e2e/reliability/test_nonfinite.py),
clipping, LAMB, Mixup, hooks, checkpoints, export and evaluation.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.launcher import assert_bitwise_equal, final_weights
from tests.helpers.runs import RECIPE, demo_args


@pytest.fixture(scope="module")
def reference_run(demo_data, tmp_path_factory):
    """Two ranks, 12 uninterrupted optimizer steps (an epoch is 11): the run the others must match."""
    workdir = tmp_path_factory.mktemp("reference")
    r = launcher.run(demo_args(demo_data, workdir, "train.max_steps=12", "train.checkpoint_every_steps=5"), nproc=2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return workdir, r


def test_two_rank_run_logs_plan_metrics_and_one_allreduce_per_step(reference_run):
    workdir, r = reference_run
    assert "total batch size = 128 = 16 (micro) x 4 (accumulation) x 2 (devices)" in r.stdout + r.stderr
    records = read_metrics(str(workdir / "metrics.jsonl"))
    train = [x for x in records if x["event"] == "train"]
    assert [x["step"] for x in train] == list(range(1, 13))
    # The recipe's precision is `auto`; the log records what it resolved to on this CPU.
    precision = next(x for x in records if x["event"] == "start")["config"]["train"]["precision"]
    assert precision in ("fp16", "bf16", "fp32") and f"precision auto -> {precision}: " in r.stdout + r.stderr
    for x in train:
        # 4 micro-steps, only the last one outside no_sync: the tiny model is one DDP bucket.
        assert x["allreduce_calls"] == 1
        assert x["loss_scale"] == (2.0**16 if precision == "fp16" else 1.0) and not x["skipped"]
        assert 0 < x["train_loss"] < 5 and x["grad_norm"] > 0 and x["images_per_s"] > 0
    assert train[0]["lr"] < train[-1]["lr"]  # still warming up
    evals = [x for x in records if x["event"] == "eval"]
    assert evals[-1]["step"] == 12 and evals[-1]["val_images"] == 360
    ckpts = sorted(p.name for p in (workdir / "checkpoints").iterdir())
    assert ckpts == ["step_0000005", "step_0000010", "step_0000012"]
    assert list((workdir / "tb").glob("events.out.tfevents.*"))


def test_accumulation_is_derived_from_world_size(demo_data, tmp_path):
    r = launcher.run(demo_args(demo_data, tmp_path, "train.max_steps=1") + ["--dry-run"], launcher="single")
    assert r.returncode == 0, r.stderr
    assert "128 = 16 (micro) x 8 (accumulation) x 1 (devices)" in r.stdout


def test_interrupted_mid_epoch_then_resumed_is_bitwise_equal(reference_run, demo_data, tmp_path):
    """Stops after step 7 (mid-epoch) on SIGTERM and resumes: same final weights as the reference."""
    ref_dir, _ = reference_run
    log = tmp_path / "first.log"
    args = demo_args(demo_data, tmp_path, "train.max_steps=12", "train.checkpoint_every_steps=5")
    proc = launcher.start(args, nproc=2, launcher="fork", log=log)
    try:
        metrics = tmp_path / "metrics.jsonl"
        seen_step = lambda: metrics.exists() and '"step": 7' in metrics.read_text()  # noqa: E731
        assert launcher.wait_for(seen_step, timeout=300, proc=proc), log.read_text()[-3000:]
        launcher.workers(proc)[-1].send_signal(signal.SIGTERM)  # one rank only: it must tell the others
        assert proc.wait(timeout=300) != 0
    finally:
        launcher.kill_tree(proc)
    text = log.read_text()
    assert "stopped on signal after step" in text, text[-3000:]
    stopped = max(int(p.name[5:]) for p in (tmp_path / "checkpoints").glob("step_*"))
    assert 7 <= stopped < 12
    r = launcher.run(args, nproc=2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"resumed from {tmp_path / 'checkpoints'}/step_{stopped:07d} at step {stopped}" in r.stdout + r.stderr
    assert_bitwise_equal(final_weights(ref_dir), final_weights(tmp_path))


def timm_accuracy(export_dir: Path, data: str) -> tuple[float, int]:
    """Top-1 of an export on the raw validation JPEGs, the way a timm user runs it: one-line load,
    timm's own eval transform from the export's config, PIL decoding. Returns (top-1, images)."""
    import io

    import timm
    import torch
    from PIL import Image
    from tfrecord.reader import tfrecord_loader

    from vitlarge.data import load_manifest

    model = timm.create_model(f"local-dir:{export_dir}", pretrained=True).eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))
    manifest = load_manifest(data)
    hits = n = 0
    with torch.no_grad():
        for shard in manifest.shards("validation"):
            records = tfrecord_loader(
                str(Path(data) / shard.file), None, {"image/encoded": "byte", "image/class/label": "int"}
            )
            for rec in records:
                image = Image.open(io.BytesIO(bytes(rec["image/encoded"]))).convert("RGB")
                label = int(rec["image/class/label"][0]) - manifest.label_offset
                hits += int(model(transform(image)[None]).argmax(1).item() == label)
                n += 1
    return hits / n, n


def test_export_loads_into_timm_and_evaluate_cli_matches(reference_run, demo_data):
    import timm

    workdir, _ = reference_run
    model = timm.create_model(f"local-dir:{workdir / 'model'}", pretrained=True)
    assert_bitwise_equal(model.state_dict(), final_weights(workdir))
    assert model.pretrained_cfg["label_names"] == [str(i) for i in range(10)]  # the manifest's class names
    last_eval = [x for x in read_metrics(str(workdir / "metrics.jsonl")) if x["event"] == "eval"][-1]
    # timm's pipeline (PIL decode, torchvision resize) against vitlarge's (DALI): same images, same
    # preprocessing parameters from config.json; JPEG decoders may differ in the last bit of a pixel.
    top1, n = timm_accuracy(workdir / "model", demo_data)
    assert n == 360 and abs(top1 - last_eval["val_top1"]) <= 3 / 360, (top1, last_eval["val_top1"])
    r = launcher.python(
        [
            "-m",
            "vitlarge.evaluate",
            "--config",
            RECIPE,
            "--data",
            demo_data,
            "--checkpoint",
            str(workdir / "checkpoints" / "step_0000012"),
            "--json",
        ],
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["val_images"] == 360
    assert got["val_top1"] == pytest.approx(last_eval["val_top1"], abs=1 / 360)


def test_dry_run_of_the_32k_recipe_with_4_processes():
    r = launcher.run(["--config", "recipes/vit_b16.py", "--dry-run"], nproc=4, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "32768 = 256 (micro) x 32 (accumulation) x 4 (devices)" in r.stdout
    assert r.stdout.count("plan:") == 1  # only rank 0 prints
    assert "39 steps/epoch, 11700 steps, 5850 warmup steps" in r.stdout
    assert "86.57M parameters" in r.stdout


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--data", "/nonexistent/imagenet"], "/nonexistent/imagenet"),
        (["--workdir", "/proc/version/run"], "workdir /proc/version/run is not writable"),
        (["--resume", "/nonexistent/step_0000001"], "checkpoint /nonexistent/step_0000001 does not exist"),
        (["train.global_batch=100"], "train.global_batch=100 is not a multiple of train.micro_batch=16"),
        (["optim.lrr=0.1"], "did you mean 'optim.lr'"),
    ],
)
def test_bad_input_is_one_clear_line(demo_data, tmp_path, extra, message):
    args = ["--config", RECIPE, "--data", demo_data, "--workdir", str(tmp_path / "w"), "train.max_steps=1"]
    r = launcher.run(args + extra, launcher="single", timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_world_size_that_does_not_divide_the_batch_fails_before_training(demo_data, tmp_path):
    r = launcher.run(demo_args(demo_data, tmp_path, "train.max_steps=1"), nproc=3, timeout=300)
    assert r.returncode != 0
    line = (
        "error: train.global_batch=128 does not divide over 3 processes, so no train.micro_batch can split it evenly; "
        "run on 2 or 4 processes (dividing 128), or make it a multiple of 3 (126 or 129)"
    )
    assert r.stderr.count(line) == 1, r.stderr[-2000:]  # once, under colossalai run with 3 ranks
    assert not (tmp_path / "checkpoints").exists()


def test_checkpoint_of_another_model_is_refused(reference_run, demo_data, tmp_path):
    workdir, _ = reference_run
    r = launcher.run(
        demo_args(
            demo_data,
            tmp_path,
            "train.max_steps=1",
            "model.kwargs={'patch_size': 4, 'embed_dim': 48, 'depth': 2, 'num_heads': 3}",
            "--resume",
            str(workdir / "checkpoints" / "step_0000012"),
        ),
        launcher="single",
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "does not match the recipe" in r.stderr.strip().splitlines()[-1]
