"""What ``train.activation_checkpointing`` off, full and selective keep for backward, and what they cost, side by side.

Question: How much activation memory do ``full`` and ``selective`` save against ``off``, and how much longer is a
forward and backward?
Goal: no target: the figures are each mode's held bytes, peak RSS growth and step time against ``off``'s.

Run: ``python -m benchmarks.bench_activation_checkpointing [--quick] [--tiny]`` (one process, 2 threads, ~2 GB;
a few minutes on 2 cores). Writes ``benchmarks/results/activation_checkpointing.json``. Not in the suite: on its
own or ``python -m benchmarks.run --only activation_checkpointing``.

ViT-S/16 at 128 px (65 tokens; ``--tiny``: the demo's ViT at 16 px), the recipes' dropouts (attention and
projection 0.1) and stochastic depth 0.1, micro-batch 16, fp32, one model per mode built by
`vitlarge.model.vit.build_model` with the same weights; the modes interleaved round by round. Three figures:

* **held after forward**: the bytes of the tensors the forward made that are alive when it returns, i.e. what
  the step keeps for backward (`benchmarks.harness.activations`: saved activations, the checkpoints' inputs,
  the matmul outputs ``selective`` caches; parameters not counted);
* **peak RSS growth**: the process's peak resident memory during one forward and backward above its resident
  memory before (the peak reset through ``/proc/self/clear_refs``; glibc set to unmap what is freed,
  `release_freed_memory`), median over the rounds: it adds the backward's transients and the recompute's;
* **step time**: one forward and backward (no optimizer), wall and CPU, median over the rounds.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from benchmarks.harness import results, timing
from benchmarks.harness.activations import held_after_forward
from benchmarks.harness.recipe import demo_config

MODES = ("off", "full", "selective")
MICRO = 16
DROP = 0.1  # the recipes' attention and projection dropout


def config(mode: str, tiny: bool):
    overrides = {
        "train.activation_checkpointing": mode,
        "train.precision": "fp32",
        "model.attn_drop_rate": DROP,
        "model.proj_drop_rate": DROP,
        "model.drop_path_rate": DROP,
    }
    return demo_config(overrides, None if tiny else "vit_small_patch16_224", 128)


def _status(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def release_freed_memory() -> None:
    """glibc's malloc returns what it frees to the system from here on: every allocation above 64 KiB is its own
    mapping, unmapped when freed (a fixed threshold: its adaptive one grows after the first large frees and then
    keeps them in the heap), so the resident memory before a step is what is alive, not the last step's peak."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt's parameters (malloc.h)
    libc.mallopt(m_mmap_threshold, 64 * 1024)
    libc.mallopt(m_trim_threshold, 128 * 1024)


def peak_rss_growth(step) -> int:
    """Peak resident memory during ``step()`` above the resident memory before it."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
    before = _status("VmRSS")
    step()
    return _status("VmHWM") - before


def run(quick: bool = True, tiny: bool = False) -> dict:
    from vitlarge.model.vit import build_model

    tiny = results.is_tiny(tiny)
    torch.set_num_threads(2)
    release_freed_memory()
    rounds = 1 if tiny else 3 if quick else 7
    cfg = config("off", tiny)
    size = cfg.data.image_size
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(MICRO, 3, size, size, generator=g), torch.randint(0, cfg.data.num_classes, (MICRO,), generator=g)
    models = {}
    for mode in MODES:
        torch.manual_seed(0)
        models[mode] = build_model(config(mode, tiny))
    held = {mode: held_after_forward(m, x, y) for mode, m in models.items()}

    def step(model):
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()

    growth = timing.interleaved({m: (lambda m=m: peak_rss_growth(lambda: step(models[m]))) for m in MODES}, rounds)
    times = timing.interleaved_wall_cpu({m: (lambda m=m: timing.timed(lambda: step(models[m]))) for m in MODES}, rounds)
    per_mode = {
        mode: {
            "held_after_forward_bytes": held[mode],
            "peak_rss_growth_bytes": int(statistics.median(growth[mode])),
            "step_s": timing.summary(times[mode]["wall_s"]),
            "cpu_s": timing.summary(times[mode]["cpu_s"]),
        }
        for mode in MODES
    }
    off = per_mode["off"]
    for r in per_mode.values():
        r["held_vs_off"] = round(r["held_after_forward_bytes"] / off["held_after_forward_bytes"], 3)
        r["rss_growth_vs_off"] = round(r["peak_rss_growth_bytes"] / max(off["peak_rss_growth_bytes"], 1), 3)
        r["step_vs_off"] = round(r["step_s"]["median"] / off["step_s"]["median"], 3)
        r["cpu_vs_off"] = round(r["cpu_s"]["median"] / off["cpu_s"]["median"], 3)
    result = {
        "benchmark": "activation checkpointing off / full / selective: memory kept for backward and step time, CPU",
        "model": cfg.model.name if not tiny else "demo",
        "model_kwargs": cfg.model.kwargs,
        "image_size": size,
        "micro_batch": MICRO,
        "dropout": DROP,
        "precision": "fp32",
        "rounds": rounds,
        "tiny": tiny,
        "quick": quick,
        "modes": per_mode,
    }
    results.write_result("activation_checkpointing", result)
    return result


def show(r: dict) -> None:
    print(f"{r['model']} at {r['image_size']} px, micro-batch {r['micro_batch']}, fp32, {r['rounds']} rounds")
    print(
        "mode        held after forward MiB (vs off)   peak RSS growth MiB (vs off)   fwd+bwd s (vs off)  CPU s (vs off)"
    )
    for mode, m in r["modes"].items():
        print(
            f"{mode:10} {m['held_after_forward_bytes'] / 2**20:12.1f} ({m['held_vs_off']:.3f})"
            f" {m['peak_rss_growth_bytes'] / 2**20:22.0f} ({m['rss_growth_vs_off']:.3f})"
            f" {m['step_s']['median']:14.3f} ({m['step_vs_off']:.2f}) {m['cpu_s']['median']:8.3f} ({m['cpu_vs_off']:.2f})"
        )


if __name__ == "__main__":
    results.cli(run, __doc__, show)
