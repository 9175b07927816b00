"""Every benchmark runs once at tiny sizes through the suite runner, so none can rot.

Asserts that each ran and wrote finite, positive numbers under the expected keys, and that the
report renders; never a speed (tiny sizes on a shared CPU mean nothing). Results and the report go
to a temp dir, not over benchmarks/results or docs/.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.report import performance as report
from tests.helpers import ROOT


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    import os

    from benchmarks import run

    out = tmp_path_factory.mktemp("bench")
    old = os.environ.get("VITLARGE_BENCH_RESULTS")
    os.environ["VITLARGE_BENCH_RESULTS"] = str(out)
    try:
        status = run.run_all(quick=True, tiny=True)
    finally:
        if old is None:
            del os.environ["VITLARGE_BENCH_RESULTS"]
        else:
            os.environ["VITLARGE_BENCH_RESULTS"] = old
    return out, status


def _load(out, name):
    return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
def test_every_benchmark_ran(suite):
    out, status = suite
    assert {k: v["error"] for k, v in status.items() if not v["ok"]} == {}
    for name in ("data", "convert", "train", "optimizer", "comm", "precision", "compile"):
        assert (out / f"{name}.json").exists(), name


@pytest.mark.slow
def test_numbers_are_present_and_positive(suite):
    out, _ = suite
    data = _load(out, "data")
    assert all(_positive(v) for v in data["images_per_s_median"].values())
    assert _positive(data["trainloader_vs_torchvision"])
    convert = _load(out, "convert")
    assert all(_positive(v) for v in convert["mb_per_s"].values())
    train = _load(out, "train")
    for side in ("vitlarge", "bare"):
        assert _positive(train["results"][side]["step_s"]["median"]) and _positive(
            train["results"][side]["images_per_s"]
        )
    assert _positive(train["speed_vs_bare"])
    mfu = train["mfu"]
    assert _positive(mfu["train_flops_per_step"]) and _positive(mfu["peak"]["bf16"]["flops_per_s"])
    assert _positive(mfu["mfu_vs_bf16_matmul"]) and "matmul" in mfu["profile"]["fraction"]
    optimizer = _load(out, "optimizer")
    assert _positive(optimizer["results"]["vitlarge_lamb"]["median_ms"])
    precision = _load(out, "precision")
    assert set(precision["results"]) == {"fp32", "bf16", "fp16", "fp16_conv_in_fp16"}
    assert all(_positive(v["images_per_s"]) for v in precision["results"].values())
    compiled = _load(out, "compile")  # one graph: the train step's shape never changed
    assert compiled["graphs"] == 1 and all(_positive(v["images_per_s"]) for v in compiled["results"].values())
    for name in ("train", "precision", "comm"):
        assert _load(out, name)["machine"]["os_cpus"] >= 1


@pytest.mark.slow
def test_comm_counts_one_all_reduce_per_bucket_at_any_accumulation(suite):
    """Not a speed: the call count is exact, so this one is a real assertion."""
    out, _ = suite
    comm = _load(out, "comm")
    assert set(comm["steady_per_step"]) == {"1", "4", "32"}
    assert comm["calls_independent_of_accumulation"] and comm["prediction_matches_measurement"]
    steady = comm["steady_per_step"]["4"]
    assert steady["calls"] == comm["demo_model"]["predicted_buckets"]
    assert steady["bytes"] == comm["demo_model"]["grad_bytes"]
    assert (
        comm["computed"]["vit_base_patch16_224"]["bytes_per_step"]
        == 4 * comm["computed"]["vit_base_patch16_224"]["params"]
    )


@pytest.mark.slow
def test_report_renders_every_section(suite):
    out, _ = suite
    text = (out / "PERFORMANCE.md").read_text()
    for heading in (
        "## Goals",
        "## 1. Data",
        "## 2. Conversion",
        "## 3. Training loop",
        "## 4. Optimizer",
        "## 5. Communication",
        "## 6. Precision",
        "## 7. Scaling on paper",
    ):
        assert heading in text
    assert "not run" not in text


def test_scaling_micro_batch_and_ring_volume():
    assert report.micro_accum(4, 256) == (256, 32)
    assert report.micro_accum(128, 256) == (256, 1)
    assert report.micro_accum(512, 256) == (64, 1)  # 512 x 256 > 32K
    assert report.ring_bytes(2, 100) == pytest.approx(100 * 4)  # 2(n-1)/n = 1 at n = 2
    assert report.ring_bytes(512, 100) == pytest.approx(2 * 511 / 512 * 400)


def test_a_section_measured_on_another_torch_than_the_installed_one_says_it_is_stale():
    pinned = report.installed_torch()
    assert f"torch=={pinned}\n" in (ROOT / "requirements.txt").read_text()
    section = ["## 1. Data loading\n", "table\n"]
    old = {"machine": {"torch": "2.5.1+cu124", "cpu": "Xeon"}}
    new = {"machine": {"torch": f"{pinned}+cu128", "cpu": "EPYC"}}
    assert "stale" in report.stamp(section, old, pinned)[1] and report.stamp(section, old, pinned)[0] == section[0]
    assert report.stamp(section, new, pinned)[1] == f"_Measured on torch {pinned}+cu128._\n"
    assert report.stamp(section, None, pinned) == section
    line = report.stacks_line({"data": old, "compile": new, "launch": None}, pinned)
    assert "torch 2.5.1+cu124 on Xeon (data): **stale**" in line and f"torch {pinned}+cu128 on EPYC (compile);" in line
