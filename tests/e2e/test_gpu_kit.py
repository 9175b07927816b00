"""The GPU measurement kit (benchmarks/gpu/) and its bundle (scripts/gpu_bundle.sh), on CPU.

Two runs of ``--device cpu --tiny`` in subprocesses, reused by every assertion:
- from the bundle, with cwd = the bundle and no PYTHONPATH, with Colossal-AI, DALI, TFRecord and
  crc32c made unimportable (tests/helpers/block_imports.py): the bare-GPU-machine case, plain path;
- in the test process, with Colossal-AI present: the Booster path (training, then ViT-L/16 of the
  large section, after which a CUDA-style error is injected by wrapping: the partial files survive).
Asserts structure and sanity (every contender, positive finite numbers, the path named, valid
JSON, the report section renders); never a speed. The CUDA-only logic that a CPU run cannot reach
(device index, datasheet names, profiler event names, the largest-fit search under out-of-memory,
the fp16 scaler's skipped steps) is tested through the pure functions and classes it lives in.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu import device as gpu_device
from benchmarks.gpu import report as gpu_report

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = "colossalai,nvidia.dali,tfrecord,crc32c"
CONTENDERS = {"vitlarge_bf16", "bare_bf16", "vitlarge_fp16", "bare_fp16", "vitlarge_compiled_bf16"}


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
    p = _kit(
        [
            sys.executable,
            str(ROOT / "tests" / "helpers" / "block_imports.py"),
            BLOCKED,
            "benchmarks.gpu",
            "--device",
            "cpu",
            "--tiny",
            "--out",
            str(out),
        ],
        bundle,
    )
    return bundle, out, json.loads((out / "gpu.json").read_text()), p.stdout


INJECTED = "CUDA error: an illegal memory access was encountered (injected by the test)"


@pytest.fixture(scope="module")
def booster_run(tmp_path_factory):
    """In this process, like tests/e2e/test_benchmarks.py: the suite imports Colossal-AI once for all.

    The large section is wrapped so that it fails once ViT-L/16 is done, as a non-memory CUDA error
    would: the run must keep what finished (train, ViT-L/16) in gpu.json/gpu.md and exit 1."""
    import contextlib
    import io
    from unittest import mock

    from benchmarks.gpu import kit as gpu

    real = gpu.large_section

    def fails_after_the_first_model(device, path, s, peak, tiny, done):
        def done_then_fail(out):
            done(out)
            raise RuntimeError(INJECTED)

        return real(device, path, s, peak, tiny, done_then_fail)

    out, stdout, stderr = tmp_path_factory.mktemp("gpukit-booster"), io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ),
        mock.patch.object(gpu, "large_section", fails_after_the_first_model),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):  # main sets VITLARGE_BENCH_RESULTS
        rc = gpu.main(["--device", "cpu", "--tiny", "--out", str(out), "--only", "train", "large"])
    return (
        rc,
        json.loads((out / "gpu.json").read_text()),
        (out / "gpu.md").read_text(),
        stdout.getvalue(),
        stderr.getvalue(),
    )


def test_bundle_is_small_and_runs_without_colossalai_dali_tfrecord_crc32c(bundle_run):
    bundle, out, r, stdout = bundle_run
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    assert size < 64 * 2**20
    assert (bundle / "benchmarks" / "gpu" / "__main__.py").is_file() and (bundle / "recipes" / "vit_h14.py").is_file()
    assert not list(bundle.rglob("*.json")), "results or data travelled with the bundle"
    assert r["path"] == "plain" and "Colossal-AI does not import" in r["path_why"]
    assert "path plain" in stdout
    assert (out / "gpu.md").read_text().startswith(gpu_report.TITLE)


def test_every_recipe_row_has_positive_finite_numbers_and_a_breakdown(bundle_run):
    _, out, r, _ = bundle_run
    assert r["device"]["type"] == "cpu" and r["tiny"] is True
    assert {"peak", "recipes", "optimizer"} <= set(r) and not {"train", "large"} & set(r)  # the default sections
    assert all(_positive(v["flops_per_s"]) for v in r["peak"]["measured"].values())
    assert set(r["peak"]["measured"]) == {"bf16", "fp16"} and r["peak"]["datasheet"] is None
    rec = r["recipes"]
    assert list(rec) == ["vit_b16", "deit3_b16", "vit_l16", "vit_h14"]
    assert set(rec["vit_b16"]["rows"]) == {"compiled_fp32", "eager_fp32", "compiled_fp32_nodrop", "bare_compiled_fp32"}
    assert all(len(e["rows"]) == 1 and not e["not_run"] for n, e in rec.items() if n != "vit_b16")  # --tiny
    for name, e in rec.items():
        assert _positive(e["train_flops_per_image"]) and _positive(e["gemm_reference"]["ms_per_micro_step"]), name
        for row, v in e["rows"].items():
            assert _positive(v["images_per_s"]) and _positive(v["mfu"]["vs_measured_matmul"]), (name, row)
            assert v["compiled"] is False and v["clocks"] is None  # --tiny runs eager; no nvidia-smi readings
            b = v["breakdown"]
            assert set(b["classes_ms"]) == set(gpu_report_classes()) and b["attention_backend_ran"] == "cpu"
            assert _positive(b["step_ms"]) and b["idle_ms"] >= 0
    assert rec["vit_b16"]["rows"]["compiled_fp32_nodrop"]["dropout"]["attn_drop_rate"] == 0.0
    assert rec["vit_b16"]["rows"]["eager_fp32"]["attention_chosen"] == "cpu" and r.get("finish_with") is None
    md = (out / "gpu.md").read_text()
    assert "| vit_b16 | `bare_compiled_fp32` (eager: --tiny) |" in md and "GEMM reference" in md
    o = r["optimizer"]
    assert set(o["results"]) == {"vitlarge_lamb", "timm_lamb"} and set(o["left_out"]) == {"colossalai_lamb"}
    for v in o["results"].values():
        assert _positive(v["ms_per_step"]["median"]) and _positive(v["launches_per_step"])
        assert v["launch_kind"].startswith("CPU") and v["syncs_per_step"] is None  # CUDA-only counts
    assert r["complete"] is True and r["failed"] == {}


def gpu_report_classes():
    from benchmarks.gpu.profile import CLASSES

    return CLASSES


def test_the_first_kits_sections_still_measure(booster_run):
    _, r, _, _, _ = booster_run
    t = r["train"]
    assert set(t["results"]) == CONTENDERS
    assert t["micro_batch"] == t["micro_batch_requested"] and t["fit_tries"] == [{"micro_batch": 4, "fits": True}]
    assert _positive(t["train_flops_per_image"]) and _positive(t["params"])
    for name, v in t["results"].items():
        assert _positive(v["images_per_s"]) and _positive(v["step_s"]["median"]), name
        assert len(v["step_s"]["all"]) == t["rounds"] and _positive(v["mfu"]["vs_measured_matmul"]), name
        assert v["peak_memory_bytes"] is None and v["mfu"]["vs_datasheet"] is None  # no allocator stats on CPU
    assert all(_positive(t["results"][f"vitlarge_{p}"]["vs_bare"]) for p in ("bf16", "fp16"))
    compiled = t["results"]["vitlarge_compiled_bf16"]  # --tiny skips the compile, and says so
    assert compiled["compiled"] is False and "--tiny" in compiled["note"] and _positive(compiled["vs_eager"])
    assert all(v["skipped_steps"] == 0 for v in t["results"].values())
    v = r["large"]["vit_l16"]
    assert v["activation_checkpointing"] == "full" and v["precision"] == "bf16"
    assert v["micro_batch"] == v["search_cap"] == 4  # CPU: no OOM, the search stops at its cap
    assert [x["micro_batch"] for x in v["fit_tries"]] == [2, 4]
    assert _positive(v["images_per_s"]) and _positive(v["mfu"]["vs_measured_matmul"])


def test_booster_path_and_a_failing_section_keeps_what_finished(booster_run):
    rc, r, md, stdout, stderr = booster_run
    assert r["path"] == "colossalai" and "path colossalai" in stdout
    assert set(r["train"]["results"]) == CONTENDERS and "optimizer" not in r
    assert all(_positive(v["images_per_s"]) for v in r["train"]["results"].values())
    assert rc == 1 and r["complete"] is False and r["failed"] == {"large": f"RuntimeError: {INJECTED}"}
    assert list(r["large"]) == ["vit_l16"] and _positive(r["large"]["vit_l16"]["images_per_s"])
    assert "Traceback" in stderr and "sections failed: large" in stderr
    assert "**Incomplete run**: large failed" in md and "| ViT-L/16 |" in md and "| ViT-H/14 |" not in md


def test_module_load_imports_nothing_heavy_and_no_cuda_is_one_line_exit_2(tmp_path):
    """One process: importing the kit loads no Colossal-AI/DALI/TFRecord/crc32c; then, without a GPU,
    the default ``--device cuda`` is refused in one line, exit 2, nothing written."""
    code = (
        "import sys, json, benchmarks.gpu.kit, benchmarks.gpu.train, benchmarks.gpu.optim, benchmarks.gpu.report; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('colossalai', 'tfrecord', 'crc32c') "
        f"or m.startswith('nvidia.dali'))), flush=True); sys.exit(benchmarks.gpu.kit.main(['--out', {str(tmp_path)!r}]))"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert json.loads(p.stdout.strip().splitlines()[0]) == []
    if gpu_device.torch.cuda.is_available():
        return  # a GPU machine runs the kit for real; the refusal is for machines without one
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0, p.stderr
    assert p.stderr.startswith("error: --device cuda") and "--device cpu --tiny" in p.stderr
    assert not list(tmp_path.iterdir())


def test_cuda_device_gets_its_index_as_set_device_needs():
    """Bare ``cuda`` (the default) had no index, and torch.cuda.set_device refused it (ValueError)."""
    from torch.cuda._utils import _get_device_index  # what torch.cuda.set_device calls

    from benchmarks.gpu.kit import pick_device
    from vitlarge.errors import UserError

    torch = gpu_device.torch
    with pytest.raises(ValueError):
        _get_device_index(torch.device("cuda"))
    assert gpu_device.resolve_device("cuda", current_index=0) == torch.device("cuda", 0)
    assert _get_device_index(gpu_device.resolve_device("cuda", current_index=2)) == 2
    assert gpu_device.resolve_device("cuda:3", current_index=0) == torch.device("cuda", 3)  # an explicit index wins
    assert gpu_device.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="use cuda, cuda:N or cpu"):
        gpu_device.resolve_device("meta")
    assert pick_device("cpu") == torch.device("cpu")
    for bad in ("tpu", "cuda:x", "meta"):
        with pytest.raises(UserError, match=f"--device {bad}: use cuda, cuda:N or cpu"):
            pick_device(bad)


@pytest.mark.parametrize(
    "name,sms,board,tflops",
    [
        ("NVIDIA H100 80GB HBM3", 132, "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", 114, "H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 132, "H100 NVL", 835.0),
        ("NVIDIA H200", 132, "H200 SXM", 989.4),
        ("NVIDIA H200 NVL", 132, "H200 NVL", 835.0),
        ("NVIDIA GH200 480GB", 132, "GH200 (Hopper GPU)", 989.4),  # not "H200 SXM"
        ("NVIDIA GH200 144G HBM3e", 132, "GH200 (Hopper GPU)", 989.4),
        ("NVIDIA A100-SXM4-80GB", 108, "A100 (SXM4 and PCIe)", 312.0),
        ("NVIDIA A100-PCIE-40GB", 108, "A100 (SXM4 and PCIe)", 312.0),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 16, "H100 SXM, MIG slice 16/132 SMs", 989.4 * 16 / 132),
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 60, "H100 SXM, MIG slice 60/132 SMs", 989.4 * 60 / 132),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 14, "A100 (SXM4 and PCIe), MIG slice 14/108 SMs", 312.0 * 14 / 108),
    ],
)
def test_datasheet_peak_matches_board_variants_and_mig_slices(name, sms, board, tflops):
    got = gpu_device.datasheet_peak(name, sms)
    assert got["board"] == board and got["dense_bf16_fp16_flops"] == pytest.approx(tflops * 1e12)


def test_datasheet_peak_refuses_other_boards_and_a_mig_slice_of_unknown_size():
    for name in ("NVIDIA GeForce RTX 4090", "NVIDIA A10", "NVIDIA A800 80GB PCIe", "NVIDIA H800", "NVIDIA L40S"):
        assert gpu_device.datasheet_peak(name, 100) is None, name
    assert gpu_device.datasheet_peak("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None) is None  # never the whole chip


def test_profiler_counts_every_launch_name_the_syncs_and_not_a_silent_zero():
    """Launch calls are named differently across CUDA/CUPTI versions; an ``.item()`` in the step is a
    DtoH copy plus a stream synchronize; calls outside the steps' window (the profiler's own closing
    synchronize) do not count; no kernel recorded means not measured (None), not 0."""
    from benchmarks.gpu.optim import MARK, count_events

    launch_names = [
        "cudaLaunchKernel",
        "cudaLaunchKernelExC_v11060",
        "cudaLaunchKernel_ptsz",
        "__cudaLaunchKernel",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
    ]
    host = [(n, False, 10.0 + i) for i, n in enumerate(launch_names)]
    host += [
        ("cudaMemcpyAsync", False, 20.0),
        ("cudaStreamSynchronize", False, 21.0),
        ("cudaMemcpyAsync", False, 22.0),
        ("cudaStreamSynchronize", False, 23.0),
        ("cudaDeviceSynchronize", False, 99.0),  # after the window
        ("cudaLaunchKernel", False, 1.0),
        ("aten::add_", False, 12.0),
        (MARK, False, 5.0),
    ]
    gpu = (
        [("void at::native::multi_tensor_apply_kernel<...>", True, 0.0)] * 6
        + [("Memcpy DtoH (Device -> Pinned)", True, 0.0)] * 2
        + [("Memset (Device)", True, 0.0), (MARK, True, 0.0)]
    )
    c = count_events(host + gpu, steps=2, window=(5.0, 50.0))
    assert c["launches_per_step"] == 3 and c["launch_api_calls_per_step"] == 3
    assert c["syncs_per_step"] == 1 and c["dtoh_copies_per_step"] == 1
    assert c["api_calls"]["cudaStreamSynchronize"] == 1 and "cudaDeviceSynchronize" not in c["api_calls"]
    none = count_events(host, steps=2, window=(5.0, 50.0))  # CUPTI gave no GPU activity
    assert none["launches_per_step"] is none["syncs_per_step"] is none["launch_api_calls_per_step"] is None
    assert none["launch_kind"].startswith("not measured")


def test_bare_loop_counts_the_steps_the_fp16_scaler_skips():
    """A step with non-finite gradients does no update (and is cheaper): the bare loop must count it,
    as the engine does, without a host read in the step."""
    from benchmarks.gpu.train import kit_config
    from benchmarks.harness.loop import BareLoop, timm_lamb

    torch = gpu_device.torch
    loop = BareLoop(kit_config("vit_b16", "fp16", 2, 2, tiny=True), torch.device("cpu"), timm_lamb)
    loop.step()
    clean = loop.skipped
    images, labels = loop.batch
    loop.batch = (images * float("inf"), labels)
    loop.step()
    assert loop.skipped == clean + 1
    loop.batch = (images, labels)
    loop.step()
    assert loop.skipped == clean + 1 and loop.steps == 3
    assert BareLoop(kit_config("vit_b16", "bf16", 2, 2, tiny=True), torch.device("cpu"), timm_lamb).skipped == 0


def test_bare_loop_uses_the_same_no_decay_names_and_clip_off_at_zero():
    from benchmarks.gpu.train import kit_config
    from benchmarks.harness.loop import BareLoop, timm_lamb
    from vitlarge.optim.lamb import param_groups

    torch = gpu_device.torch
    cfg = kit_config("vit_b16", "bf16", 2, 1, tiny=True)
    cfg.optim.clip_grad_norm = 0.0
    loop = BareLoop(cfg, torch.device("cpu"), timm_lamb)
    ours = param_groups(loop.model, cfg.optim.weight_decay)
    theirs = loop.opt.param_groups

    def no_decay(groups):
        return {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]}

    assert no_decay(theirs) == no_decay(ours) and id(loop.model.pos_embed) in no_decay(theirs)
    cfg.optim.clip_grad_norm = 1e30  # never reached: no clipping
    unclipped = BareLoop(cfg, torch.device("cpu"), timm_lamb)  # same seed, same batch
    for run in (loop, unclipped):  # the same dropout masks
        torch.manual_seed(0)
        run.step()  # clip 0 = off, as in the engine (clip_grad_norm_(.., 0) would zero the gradients)
    assert all(torch.equal(a, b) for a, b in zip(loop.model.parameters(), unclipped.model.parameters()))


def test_report_section_without_a_gpu_run_says_so_and_has_no_numbers(bundle_run):
    empty = "\n".join(gpu_report.section(None))
    assert gpu_report.NOT_MEASURED in empty and "img/s |" in empty
    table = [line for line in empty.splitlines() if line.startswith("| not measured")]
    assert table == [f"| {gpu_report.NOT_MEASURED} | - | - | - | - | - |"]
    first = json.loads((ROOT / "benchmarks" / "results" / "gpu.json").read_text())  # the first kit's sections (H200)
    full = gpu_report.section(first)
    assert sum(line.startswith("| `") for line in full) == len(CONTENDERS) + 3  # + 3 optimizers
    assert any(line.startswith("| ViT-H/14 |") for line in full)
    recipes = gpu_report.section(bundle_run[2])
    assert any(line.startswith("| vit_h14 | `compiled_fp32` (eager: --tiny) | 4 |") for line in recipes)
    assert sum(line.startswith("| `") for line in recipes) == 3  # 2 optimizers, 1 left out
    r = json.loads(json.dumps(first))
    r["large"]["vit_h14"] = {k: v for k, v in r["large"]["vit_h14"].items() if k not in ("images_per_s", "mfu")}
    r["large"]["vit_h14"]["micro_batch"] = 0
    row = next(line for line in gpu_report.section(r) if line.startswith("| ViT-H/14 |"))
    assert "does not fit" in row and "0.0" not in row


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


@pytest.mark.parametrize("limit,expected", [(200, 192), (12, 12), (5, 5), (4096, 1024), (0, 0)])
def test_largest_fit_doubles_then_bisects_and_goes_down_from_a_failed_start(limit, expected):
    from benchmarks.gpu.kit import largest_fit
    from benchmarks.gpu.train import kit_config

    cfg = kit_config("vit_l16", "bf16", 4, 1, tiny=True)
    run = _FitsUpTo(limit)
    best, tries, _ = largest_fit(lambda: run, cfg, gpu_device.torch.device("cpu"), start=16, cap=1024)
    assert best == expected
    assert [t["micro_batch"] for t in tries] == run.sizes
    assert all(t["fits"] == (t["micro_batch"] <= limit) for t in tries)


def test_largest_fit_builds_a_fresh_run_after_running_out_of_memory_mid_backward(process_group):
    """An out-of-memory error in the backward, after DDP's reducer has seen the later layers' gradients (raised
    here from the patch embedding's gradient hook, the last gradient a ViT's backward makes, above 4 images),
    leaves that run's next forward failing with DDP's own RuntimeError, which no fake out-of-memory shows:
    the memory probe would stop there. `largest_fit` builds the run afresh after each out-of-memory step."""
    import torch

    from benchmarks.gpu.kit import largest_fit
    from benchmarks.gpu.train import EngineRun, kit_config, synthetic_batch

    cpu = torch.device("cpu")
    cfg = kit_config("vit_b16", "fp32", 2, 1, tiny=True)
    built = []

    def make():
        run = EngineRun(cfg, cpu, "colossalai")

        def out_of_memory_above_4(grad):
            if len(run.batch[0]) > 4:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (test, mid-backward)")
            return grad

        run.engine.params[0].register_hook(out_of_memory_above_4)
        built.append(run)
        return run

    reused = make()
    reused.set_batch(synthetic_batch(cfg, cpu, 8))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        reused.step()
    reused.set_batch(synthetic_batch(cfg, cpu, 2))
    with pytest.raises(RuntimeError, match="Expected to have finished reduction in the prior iteration"):
        reused.step()

    built.clear()
    best, tries, run = largest_fit(make, cfg, cpu, start=2, cap=16)
    assert best == 4
    assert [(t["micro_batch"], t["fits"]) for t in tries] == [(2, True), (4, True), (8, False), (6, False), (5, False)]
    assert len(built) == 4 and run is built[-1]  # the first, and one after each of the 3 failures
    run.set_batch(synthetic_batch(cfg, cpu, best))
    run.step()  # the run handed back for timing trains
