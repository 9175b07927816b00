"""The GPU measurement kit (benchmarks/gpu.py) and its bundle (scripts/gpu_bundle.sh), on CPU.

Two runs of ``--device cpu --tiny`` in subprocesses, reused by every assertion:
- from the bundle, with cwd = the bundle and no PYTHONPATH, with Colossal-AI, DALI, TFRecord and
  crc32c made unimportable (tests/block_imports.py): the bare-GPU-machine case, plain path;
- in the test process, with Colossal-AI present: the Booster path (training section only).
Asserts structure and sanity (every contender, positive finite numbers, the path named, valid
JSON, the report section renders); never a speed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_device, gpu_report

ROOT = Path(__file__).resolve().parent.parent
BLOCKED = "colossalai,nvidia.dali,tfrecord,crc32c"
CONTENDERS = {"vitlarge_bf16", "bare_bf16", "vitlarge_fp16", "bare_fp16"}


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VITLARGE_BENCH_RESULTS")}
    return {**env, "OMP_NUM_THREADS": "1"}


def _kit(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def bundle_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpukit")
    bundle = tmp / "bundle"
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu_bundle.sh"), str(bundle)], check=True, capture_output=True)
    out = tmp / "out"
    p = _kit([sys.executable, str(ROOT / "tests" / "block_imports.py"), BLOCKED, "benchmarks.gpu",
              "--device", "cpu", "--tiny", "--out", str(out)], bundle)
    return bundle, out, json.loads((out / "gpu.json").read_text()), p.stdout


@pytest.fixture(scope="module")
def booster_run(tmp_path_factory):
    """In this process, like tests/test_benchmarks.py: the suite imports Colossal-AI once for all."""
    import contextlib
    import io
    from unittest import mock

    from benchmarks import gpu

    out, stdout = tmp_path_factory.mktemp("gpukit-booster"), io.StringIO()
    with mock.patch.dict(os.environ), contextlib.redirect_stdout(stdout):  # main sets VITLARGE_BENCH_RESULTS
        assert gpu.main(["--device", "cpu", "--tiny", "--out", str(out), "--only", "train"]) == 0
    return json.loads((out / "gpu.json").read_text()), stdout.getvalue()


def test_bundle_is_small_and_runs_without_colossalai_dali_tfrecord_crc32c(bundle_run):
    bundle, out, r, stdout = bundle_run
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    assert size < 64 * 2**20
    assert (bundle / "benchmarks" / "gpu.py").is_file() and (bundle / "recipes" / "vit_h14.py").is_file()
    assert not list(bundle.rglob("*.json")), "results or data travelled with the bundle"
    assert r["path"] == "plain" and "Colossal-AI does not import" in r["path_why"]
    assert "path plain" in stdout
    assert (out / "gpu.md").read_text().startswith(gpu_report.TITLE)


def test_every_contender_has_positive_finite_numbers(bundle_run):
    _, _, r, _ = bundle_run
    assert r["device"]["type"] == "cpu" and r["tiny"] is True
    assert {"peak", "train", "optimizer", "large"} <= set(r)
    assert all(_positive(v["flops_per_s"]) for v in r["peak"]["measured"].values())
    assert set(r["peak"]["measured"]) == {"bf16", "fp16"} and r["peak"]["datasheet"] is None
    t = r["train"]
    assert set(t["results"]) == CONTENDERS
    assert t["micro_batch"] == t["micro_batch_requested"] and t["fit_tries"] == [{"micro_batch": 4, "fits": True}]
    assert _positive(t["train_flops_per_image"]) and _positive(t["params"])
    for name, v in t["results"].items():
        assert _positive(v["images_per_s"]) and _positive(v["step_s"]["median"]), name
        assert len(v["step_s"]["all"]) == t["rounds"] and _positive(v["mfu"]["vs_measured_matmul"]), name
        assert v["peak_memory_bytes"] is None and v["mfu"]["vs_datasheet"] is None  # no allocator stats on CPU
    assert all(_positive(t["results"][f"vitlarge_{p}"]["vs_bare"]) for p in ("bf16", "fp16"))
    o = r["optimizer"]
    assert set(o["results"]) == {"vitlarge_lamb", "timm_lamb"} and set(o["left_out"]) == {"colossalai_lamb"}
    for v in o["results"].values():
        assert _positive(v["ms_per_step"]["median"]) and _positive(v["launches_per_step"])
        assert v["launch_kind"].startswith("CPU")
    for name in ("vit_l16", "vit_h14"):
        v = r["large"][name]
        assert v["grad_checkpointing"] and v["precision"] == "bf16"
        assert v["micro_batch"] == v["search_cap"] == 4  # CPU: no OOM, the search stops at its cap
        assert [x["micro_batch"] for x in v["fit_tries"]] == [2, 4]
        assert _positive(v["images_per_s"]) and _positive(v["mfu"]["vs_measured_matmul"])


def test_booster_path_when_colossalai_imports(booster_run):
    r, stdout = booster_run
    assert r["path"] == "colossalai" and "path colossalai" in stdout
    assert set(r["train"]["results"]) == CONTENDERS and "optimizer" not in r and "large" not in r
    assert all(_positive(v["images_per_s"]) for v in r["train"]["results"].values())


def test_module_load_imports_nothing_heavy_and_no_cuda_is_one_line_exit_2(tmp_path):
    """One process: importing the kit loads no Colossal-AI/DALI/TFRecord/crc32c; then, without a GPU,
    the default ``--device cuda`` is refused in one line, exit 2, nothing written."""
    code = ("import sys, json, benchmarks.gpu, benchmarks.gpu_train, benchmarks.gpu_optim, benchmarks.gpu_report; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('colossalai', 'tfrecord', 'crc32c') "
            f"or m.startswith('nvidia.dali'))), flush=True); sys.exit(benchmarks.gpu.main(['--out', {str(tmp_path)!r}]))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert json.loads(p.stdout.strip().splitlines()[0]) == []
    if gpu_device.torch.cuda.is_available():
        return  # a GPU machine runs the kit for real; the refusal is for machines without one
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0, p.stderr
    assert p.stderr.startswith("error: --device cuda") and "--device cpu --tiny" in p.stderr
    assert not list(tmp_path.iterdir())


def test_datasheet_peak_matches_board_variants():
    assert gpu_device.datasheet_peak("NVIDIA H100 80GB HBM3")["board"] == "H100 SXM"
    assert gpu_device.datasheet_peak("NVIDIA H100 PCIe")["dense_bf16_fp16_flops"] == 756e12
    assert gpu_device.datasheet_peak("NVIDIA H100 NVL")["board"] == "H100 NVL"
    assert gpu_device.datasheet_peak("NVIDIA A100-SXM4-80GB")["dense_bf16_fp16_flops"] == 312e12
    assert gpu_device.datasheet_peak("NVIDIA GeForce RTX 4090") is None


def test_report_section_without_a_gpu_run_says_so_and_has_no_numbers(bundle_run):
    empty = "\n".join(gpu_report.section(None))
    assert gpu_report.NOT_MEASURED in empty and "img/s |" in empty
    table = [line for line in empty.splitlines() if line.startswith("| not measured")]
    assert table == [f"| {gpu_report.NOT_MEASURED} | - | - | - | - | - |"]
    full = gpu_report.section(bundle_run[2])
    assert sum(line.startswith("| `") for line in full) == len(CONTENDERS) + 3  # + 2 optimizers, 1 left out
    assert any(line.startswith("| ViT-H/14 |") for line in full)


class _FitsUpTo:
    """A step that runs out of device memory above ``limit`` images, as a CUDA step would (CPU has no limit)."""

    def __init__(self, limit: int):
        self.limit, self.sizes = limit, []

    def set_batch(self, batch):
        self.batch = batch

    def step(self):
        self.sizes.append(len(self.batch[0]))
        if len(self.batch[0]) > self.limit:
            raise gpu_device.torch.cuda.OutOfMemoryError("CUDA out of memory (test)")


@pytest.mark.parametrize("limit,expected", [(200, 192), (5, 4), (4096, 1024), (0, 0)])
def test_largest_fit_doubles_then_bisects_and_goes_down_from_a_failed_start(limit, expected):
    from benchmarks.gpu import largest_fit
    from benchmarks.gpu_train import kit_config

    cfg = kit_config("vit_l16", "bf16", 4, 1, tiny=True)
    run = _FitsUpTo(limit)
    best, tries = largest_fit(run, cfg, gpu_device.torch.device("cpu"), start=16, cap=1024)
    assert best == expected
    assert [t["micro_batch"] for t in tries] == run.sizes
    assert all(t["fits"] == (t["micro_batch"] <= limit) for t in tries)
