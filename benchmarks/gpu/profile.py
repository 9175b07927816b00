"""Where a training step's time goes, for the GPU kit's recipe rows (benchmarks/gpu/recipes.py).

- `breakdown`: ``torch.profiler`` over a few steps. On CUDA every kernel is put in one class by its name
  (`kernel_class`): GEMM (cuBLAS/CUTLASS/nvjet matmuls, Inductor's matmul templates, the patch convolution),
  attention (the SDPA kernel; its backend named from the kernel, `attention_backend`), optimizer (the
  multi-tensor kernels of the foreach/fused optimizers), communication (NCCL), and norms and element-wise (the
  rest: LayerNorm, GELU, dropout, softmax, casts, Inductor's fused Triton kernels, copies). Each class is ms per
  step of kernel time; idle is the step's time on the host clock less the union of the kernel intervals (the
  GPU waiting for the host: launches, Python, the loss read). On the CPU there are no kernels: the aten operators'
  self time, by the same classes of name, stands in (the ``--tiny`` smoke run).
- `gemm_reference`: the model's own linear-layer GEMMs at the row's micro-batch (forward and the two backward
  products of every ``nn.Linear`` and the patch embedding), each shape timed alone in the row's precision: the
  time a step's GEMMs take at their standalone speed, and their FLOP/s.
- `ClockSampler`: ``nvidia-smi`` SM clock and power draw sampled while a row is timed, where it answers.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import time
from collections.abc import Callable

import torch

CLASSES = ("gemm", "attention", "norms and element-wise", "optimizer", "communication")
_GEMM = re.compile(r"gemm|cutlass|xmma|nvjet|cublas|matmul|s16816|s1688|wgmma|triton_tem|splitk|conv|implicit|_mm_|^mm")
_ATTN = re.compile(r"flash|fmha|attention|sdpa|attn")
_OPT = re.compile(r"multi_tensor|foreach|lamb|adam")
_COMM = re.compile(r"nccl|all_?reduce|allgather|reduce_?scatter|gloo|broadcast")


def kernel_class(name: str) -> str:
    """The class of a CUDA kernel (or, on the CPU, an aten operator) by its name."""
    n = name.lower()
    if _COMM.search(n):
        return "communication"
    if n.startswith("triton_") and not n.startswith("triton_tem"):  # Inductor's fused point-wise/reduction kernels,
        return "norms and element-wise"  # named after the ops around them (an attention's view, say)
    if _ATTN.search(n):
        return "attention"
    if _OPT.search(n):
        return "optimizer"
    if _GEMM.search(n) or n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul"):
        return "gemm"
    return "norms and element-wise"


def attention_backend(names: list[str]) -> str:
    """The SDPA backend whose kernels ran, from their names; ``none`` where no attention kernel ran (the math path,
    or unfused attention: batched matmuls and a softmax)."""
    low = [n.lower() for n in names if kernel_class(n) == "attention"]
    if any("cudnn" in n and _ATTN.search(n) for n in low):
        return "cudnn"
    if any("flash" in n for n in low):
        return "flash"
    if any(("fmha" in n or "efficient" in n or "mem_eff" in n) for n in low):
        return "efficient"
    if low:
        return "other: " + low[0][:60]
    return "none"


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            total, end = total + (b - a), b
        elif b > end:
            total, end = total + (b - end), b
    return total


def breakdown(step: Callable[[], object], device: torch.device, steps: int) -> dict:
    """ms per step by class over ``steps`` profiled steps, idle, the attention backend that ran, the top kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    per_class: dict[str, float] = collections.defaultdict(float)
    names: dict[str, float] = collections.defaultdict(float)
    if device.type == "cuda":
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        intervals = []
        for e in kernels:
            dur = (e.time_range.end - e.time_range.start) / 1e3
            per_class[kernel_class(e.name)] += dur / steps
            names[e.name] += dur / steps
            intervals.append((e.time_range.start, e.time_range.end))
        busy = _union(intervals) / 1e3 / steps
        counted = "CUDA kernels (torch.profiler), ms per step; idle = step time less the union of kernel intervals"
        backend = attention_backend(list(names))
    else:
        ops = [e for e in prof.events() if e.device_type == DeviceType.CPU and e.name.startswith("aten::")]
        for e in ops:
            per_class[kernel_class(e.name)] += e.self_cpu_time_total / 1e3 / steps
            names[e.name] += e.self_cpu_time_total / 1e3 / steps
        busy = sum(per_class.values())
        counted = "CPU: aten operators' self time (no kernels without a GPU), ms per step; the numbers mean little"
        backend = "cpu"
    top = sorted(names.items(), key=lambda kv: -kv[1])[:8]
    return {
        "step_ms": round(wall_ms, 3),
        "classes_ms": {c: round(per_class.get(c, 0.0), 3) for c in CLASSES},
        "idle_ms": round(max(0.0, wall_ms - busy), 3),
        "attention_backend_ran": backend,
        "top": [{"name": n[:120], "ms": round(ms, 3), "class": kernel_class(n)} for n, ms in top],
        "counted": counted,
        "profiled_steps": steps,
    }


def linear_shapes(model: torch.nn.Module, micro_batch: int) -> list[tuple[int, int, int, int]]:
    """``(M, K, N, count)`` of the forward GEMM of every ``nn.Linear`` (rows: tokens, or images for the head) and
    of the patch embedding (as a GEMM over patches), for ``micro_batch`` images."""
    embed = getattr(model, "patch_embed", None)
    patches = int(getattr(embed, "num_patches", 0) or 0)
    tokens = patches + int(getattr(model, "num_prefix_tokens", 1))
    counts: collections.Counter = collections.Counter()
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            rows = micro_batch if name.startswith(("head", "fc_norm")) else micro_batch * tokens
            counts[(rows, m.in_features, m.out_features)] += 1
    proj = getattr(embed, "proj", None)
    if isinstance(proj, torch.nn.Conv2d):
        k = proj.in_channels * proj.kernel_size[0] * proj.kernel_size[1]
        counts[(micro_batch * patches, k, proj.out_channels)] += 1
    return [(m, k, n, c) for (m, k, n), c in counts.items()]


def _time_matmul(a: torch.Tensor, b: torch.Tensor, device: torch.device, iters: int) -> float:
    from benchmarks.harness import timing

    for _ in range(2):
        torch.matmul(a, b)
    return timing.device_seconds(lambda: [torch.matmul(a, b) for _ in range(iters)], device) / iters


def gemm_reference(
    model: torch.nn.Module, micro_batch: int, dtype: torch.dtype, device: torch.device, iters: int
) -> dict:
    """The step's linear-layer GEMMs (forward, input gradient, weight gradient) timed alone, shape by shape."""
    total_s, flops, shapes = 0.0, 0.0, []
    gen = torch.Generator(device=device).manual_seed(0)
    for m, k, n, count in linear_shapes(model, micro_batch):
        row = {"m": m, "k": k, "n": n, "count": count}
        for what, (p, q, r) in (("fwd", (m, k, n)), ("dgrad", (m, n, k)), ("wgrad", (n, m, k))):
            a = torch.randn(p, q, device=device, dtype=dtype, generator=gen)
            b = torch.randn(q, r, device=device, dtype=dtype, generator=gen)
            s = _time_matmul(a, b, device, iters)
            row[f"{what}_ms"] = round(s * 1e3, 4)
            total_s += s * count
            flops += 2 * p * q * r * count
            del a, b
        shapes.append(row)
    return {
        "ms_per_micro_step": round(total_s * 1e3, 3),
        "flops_per_micro_step": flops,
        "flops_per_s": flops / total_s if total_s else None,
        "shapes": shapes,
        "what": "forward, input-gradient and weight-gradient GEMM of every nn.Linear and the patch embedding at the "
        "row's micro-batch, each shape timed alone (torch.matmul, random data, the row's precision)",
    }


class ClockSampler:
    """``nvidia-smi`` SM clock (MHz) and power (W) every 200 ms while in use; empty where nvidia-smi is absent."""

    QUERY = "clocks.sm,clocks.mem,power.draw,temperature.gpu"

    def __init__(self, index: int = 0):
        self.index, self.proc = index, None

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                [
                    "nvidia-smi",
                    f"--id={self.index}",
                    f"--query-gpu={self.QUERY}",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    "200",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        return self

    def __exit__(self, *exc):
        self.lines = []
        if self.proc is not None:
            self.proc.terminate()
            out, _ = self.proc.communicate(timeout=5)
            self.lines = out.splitlines()

    def summary(self) -> dict | None:
        rows = []
        for line in getattr(self, "lines", []):
            try:
                rows.append([float(x) for x in line.split(",")])
            except ValueError:  # "[N/A]" where the board does not report one
                continue
        if not rows:
            return None
        from statistics import median

        cols = list(zip(*rows))
        return {
            "sm_mhz_median": median(cols[0]),
            "mem_mhz_median": median(cols[1]),
            "power_w_median": median(cols[2]),
            "power_w_max": max(cols[2]),
            "temperature_c_max": max(cols[3]),
            "samples": len(rows),
        }
