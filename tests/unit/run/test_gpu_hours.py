"""``--dry-run --gpu KIND``: wall time and GPU-hours from the GPU kit's images/s, against a hand computation.

The kit's results are a file made here (an H100 row set), so the arithmetic is checked on known numbers: ViT-B/16
(86,567,656 parameters) for vit_b16's 300 epochs of ImageNet at 32,768 images a step: 39 steps an epoch, 11,700
steps."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import ROOT
from tests.unit.run.test_dry_run import dry_run
from vitlarge.errors import UserError
from vitlarge.run import cli

PARAMS, STEPS, BATCH = 86_567_656, 11_700, 32_768


@pytest.fixture
def h100_results(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(
        json.dumps(
            {
                "device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"},
                "finished_at": "2026-12-01 10:00:00",
                "recipes": {
                    "vit_b16": {
                        "model": "vit_base_patch16_224",
                        "image_size": 224,
                        "micro_batch": 256,
                        "activation_checkpointing": "off",
                        "rows": {
                            "compiled_fp16": {"precision": "fp16", "compiled": True, "images_per_s": 2000.0},
                            "eager_fp16": {"precision": "fp16", "compiled": False, "images_per_s": 1600.0},
                        },
                    }
                },
            }
        )
    )
    return path


def totals(out: str) -> tuple[float, float]:
    m = re.search(r"total: ([\d.]+) h wall, ([\d,.]+) GPU-hours", out)
    assert m, out
    return float(m[1]), float(m[2].replace(",", ""))


def test_measured_kind_inside_a_node(capsys, h100_results):
    out, _ = dry_run(
        capsys,
        "--config",
        str(ROOT / "recipes" / "vit_b16.py"),
        "--world-size",
        "8",
        "--gpu",
        "h100",
        "--gpu-results",
        str(h100_results),
    )
    step = BATCH / (8 * 2000.0) + 2 * 7 / 8 * PARAMS * 4 / 150e9  # vit_b16 compiles on CUDA: the compiled fp16 row
    wall, gpu_hours = totals(out)
    assert wall == pytest.approx(STEPS * step / 3600, abs=0.005)  # 6.67 h
    assert gpu_hours == pytest.approx(8 * STEPS * step / 3600, abs=0.05)  # 53.4
    gpu_time = out.split("gpu time (")[1]
    assert "recipes.vit_b16.compiled_fp16 2,000.0 img/s" in gpu_time and "not measured" not in gpu_time


def test_another_kind_across_nodes_takes_the_datasheet_ratio_and_says_so(capsys, h100_results):
    out, _ = dry_run(
        capsys,
        "--config",
        str(ROOT / "recipes" / "vit_b16.py"),
        "--world-size",
        "16",
        "--gpu",
        "a100",
        "--gpu-results",
        str(h100_results),
        "train.compile=off",
    )
    ips = 1600.0 * 312.0 / 989.4  # the eager row, at the A100's share of the H100's dense bf16 peak
    step = BATCH / (16 * ips) + 2 * 15 / 16 * PARAMS * 4 / 20e9  # 16 GPUs: the ring crosses nodes
    wall, gpu_hours = totals(out)
    assert wall == pytest.approx(STEPS * step / 3600, abs=0.005)
    assert gpu_hours == pytest.approx(16 * STEPS * step / 3600, abs=0.05)
    assert "A100 SXM4 not measured: x 0.32, the dense bf16 datasheet ratio" in out
    assert "at 20 GB/s across nodes" in out


def test_without_results_or_a_dry_run_it_says_what_to_do(tmp_path):
    args = cli.parse_args(
        ["--config", "recipes/vit_b16.py", "--dry-run", "--gpu", "h200", "--gpu-results", str(tmp_path / "none.json")]
    )
    from tests.unit.run.test_dry_run import ONE_PROCESS
    from vitlarge.distributed.threads import NO_THREADS

    with pytest.raises(UserError, match="no GPU kit results at .*none.json; run python -m benchmarks.gpu"):
        cli.plan_or_train(args, ONE_PROCESS, NO_THREADS)
    for argv in (["--gpu", "h100"], ["--dry-run", "--gpu-results", "x.json"], ["--dry-run", "--gpu", "v100"]):
        with pytest.raises(SystemExit) as e:
            cli.parse_args(["--config", "recipes/vit_b16.py", *argv])
        assert e.value.code == 2
