"""Optimizer step time on ViT-B/16's parameters: our LAMB (each of its forms) vs Colossal-AI's, timm's, AdamW.

Question: Is vitlarge's LAMB step faster than Colossal-AI's (and timm's, and AdamW's) on the same
parameters, and what does each form of it (``optim.implementation``: chunked, foreach, compiled) cost here?
Goal: ``results.vitlarge_lamb.speedup_vs_colossalai`` (or the CPU-time one) >= 3.

Run: ``python -m benchmarks.bench_optimizer [--quick]`` (CPU, fp32, 2 threads, ~6 GB RAM;
~1-2 min on an idle machine; without ``--quick`` the compiled form too, which Inductor compiles for minutes).
Writes ``benchmarks/results/optimizer.json``. All optimizers run in one process on the same
parameters and random gradients (86M elements in ~150 tensors); we report the median of the
timed repeats after one warm-up step, interleaving the optimizers step by step.
Goal: ours >= 3x faster than ``colossalai.nn.optimizer.Lamb`` on CPU.

The result also holds the step's memory-traffic floor (`traffic`): the bytes a LAMB step must move per parameter,
by form, and for ViT-B/16 in all. A GPU measures the step against it (the kit: the step's time next to the time of
moving those bytes at the bandwidth a device-to-device copy reaches).
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.harness import results, timing

LR, WEIGHT_DECAY = 1e-3, 0.05
VIT_B16_PARAMS = 86_567_656

LAMB_BYTES_PER_PARAMETER = {
    "floor": 28,
    "compiled": 40,
    "eager": 56,
}
"""fp32 bytes a LAMB step moves per parameter. ``floor``: each of weight, gradient and the two moments read once
(16) and weight and moments written once (12), what any optimizer with two moments moves. LAMB cannot reach it in
one pass: its trust ratio needs the norm of the whole update direction before any weight changes, so a second pass
reads again. ``compiled`` (`vitlarge.optim.lamb._moments_and_squares`, `_apply_update`): read weight, gradient and
moments, write the moments (24); read weight and moments, write the weight (16). ``eager`` (``chunked`` and
``foreach``): ``u = wd * w`` (8), the fused Adam kernel on u (read u, g, m, v, write u, m, v: 28), the norms of w
and u (8), ``w += r * u`` (12). The multiple of the floor a form can at best reach: 1.43x and 2.0x."""


def traffic(params: int = VIT_B16_PARAMS) -> dict:
    """Bytes per LAMB step for ``params`` fp32 parameters, by form (`LAMB_BYTES_PER_PARAMETER`)."""
    return {form: b * params for form, b in LAMB_BYTES_PER_PARAMETER.items()}


def floor_ms(params: int, bandwidth_bytes_per_s: float, form: str = "floor") -> float:
    """The time ``form``'s bytes take at ``bandwidth_bytes_per_s`` (a device-to-device copy's measured rate, read
    plus written bytes per second): what a step of that form cannot beat."""
    return traffic(params)[form] / bandwidth_bytes_per_s * 1e3


def _optimizers(compiled: bool = False) -> dict:
    """name -> factory(params). The LAMBs get the same math: bias correction on, no clipping."""
    import timm.optim
    from colossalai.nn.optimizer import Lamb as ColossalLamb

    from vitlarge.optim.lamb import Lamb

    kw = dict(lr=LR, weight_decay=WEIGHT_DECAY, eps=1e-6)
    forms = {
        "vitlarge_lamb": lambda ps: Lamb(ps, **kw),  # optim.implementation=chunked, auto on CPU
        "vitlarge_lamb_foreach": lambda ps: Lamb(ps, implementation="foreach", **kw),  # auto on CUDA
        "vitlarge_lamb_unfused": lambda ps: Lamb(ps, fused=False, **kw),
    }
    if compiled:
        forms["vitlarge_lamb_compiled"] = lambda ps: Lamb(ps, implementation="compiled", **kw)
    return {
        **forms,
        "colossalai_lamb": lambda ps: ColossalLamb(ps, bias_correction=True, **kw),
        "timm_lamb": lambda ps: timm.optim.Lamb(ps, max_grad_norm=None, always_adapt=True, **kw),
        "torch_adamw_foreach": lambda ps: torch.optim.AdamW(ps, foreach=True, **kw),
    }


def run(quick: bool, tiny: bool = False) -> dict:
    import timm

    torch.set_num_threads(2)
    torch.manual_seed(0)
    repeats = 3 if quick else 7
    shrink = dict(depth=1, embed_dim=32, num_heads=2, img_size=32) if results.is_tiny(tiny) else {}  # smoke test
    model = timm.create_model("vit_base_patch16_224", pretrained=False, **shrink)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [torch.randn_like(p) * 1e-3 for p in params]  # shared: no optimizer writes to grads
    del model
    optimizers, warm_s = {}, {}
    for name, make in _optimizers(compiled=not quick and not results.is_tiny(tiny)).items():
        ps = [torch.nn.Parameter(p.detach().clone()) for p in params]
        for p, g in zip(ps, grads):
            p.grad = g
        optimizers[name] = make(ps)
        t = time.perf_counter()
        optimizers[name].step()  # warm-up: allocates state and scratch, first-touch page faults; compiles
        warm_s[name] = round(time.perf_counter() - t, 2)
    # Round-robin, so load from other processes on a shared machine hits every optimizer alike.
    # CPU time (both threads) is recorded too: on a shared machine it is steadier than wall time.
    times = timing.interleaved_wall_cpu({n: (lambda o=o: timing.timed(o.step)) for n, o in optimizers.items()}, repeats)
    wall = {n: [w * 1e3 for w in t["wall_s"]] for n, t in times.items()}
    cpu = {n: [c * 1e3 for c in t["cpu_s"]] for n, t in times.items()}
    per_optimizer = {
        name: {
            "median_ms": round(statistics.median(wall[name]), 2),
            "median_cpu_ms": round(statistics.median(cpu[name]), 2),
            "all_ms": [round(x, 2) for x in wall[name]],
            "first_step_s": warm_s[name],
        }
        for name in optimizers
    }
    colossal = per_optimizer["colossalai_lamb"]
    for r in per_optimizer.values():
        r["speedup_vs_colossalai"] = round(colossal["median_ms"] / r["median_ms"], 2)
        r["cpu_speedup_vs_colossalai"] = round(colossal["median_cpu_ms"] / r["median_cpu_ms"], 2)
    report = {
        "benchmark": "optimizer step, ViT-B/16 parameters, fp32, CPU",
        "num_params": sum(p.numel() for p in params),
        "num_tensors": len(params),
        "repeats": repeats,
        "results": per_optimizer,
        "traffic": {"bytes_per_parameter": LAMB_BYTES_PER_PARAMETER, "vit_b16_bytes": traffic()},
    }
    results.write_result("optimizer", report)
    return report


def show(report: dict) -> None:
    for name, r in report["results"].items():
        print(
            f"{name:24s} {r['median_ms']:9.1f} ms/step ({r['median_cpu_ms']:9.1f} CPU ms)  "
            f"{r['speedup_vs_colossalai']:5.2f}x ({r['cpu_speedup_vs_colossalai']:5.2f}x CPU) "
            "vs colossalai"
        )
    print(f"wrote {results.results_dir() / 'optimizer.json'}")


if __name__ == "__main__":
    results.cli(run, __doc__, show)
