"""Step time by precision on this CPU: fp32 vs bf16 vs fp16 autocast, through vitlarge's Engine.

Question: Which autocast dtype trains fastest on this CPU (what should ``train.precision=auto``
pick)?
Goal: no target: the figure is ``speed_vs_fp32`` (and ``speed_vs_fp32_cpu``) per contender.

Run: ``python -m benchmarks.bench_precision [--quick]`` (CPU, 2 threads, ~2-3 min quick on an idle
machine). Writes ``benchmarks/results/precision.json``.

Same model, data and optimizer as ``bench_train`` (ViT-S/16 at 96 px, micro-batch 32, LAMB, one
process, Booster DDP on gloo world 1). Contenders, timed step by step, interleaved:
``fp32``, ``bf16``, ``fp16`` (with dynamic loss scaling; ``model.fused_attn=auto`` turns the fused
SDPA attention off for fp16 on CPU, and the patch-embedding conv runs in fp32) and
``fp16_conv_in_fp16`` (the conv left to autocast, as before ``vitlarge.model.vit.Fp32Conv2d``: PyTorch
2.5's fp16 conv backward on CPU is a slow fallback).
The precision that is fastest on a GPU (bf16/fp16: tensor cores) need not be on a CPU: without AMX,
low-precision matmuls run on AVX-512 and the casts autocast adds are pure overhead.
"""

from __future__ import annotations

import json

import torch

from benchmarks.bench_train import bench_config
from benchmarks.harness import results, timing
from benchmarks.harness.loop import build_engine, engine_stepper, make_batches, single_process

CONTENDERS = {  # name -> (train.precision, patch-embedding conv as vitlarge builds it)
    "fp32": ("fp32", True),
    "bf16": ("bf16", True),
    "fp16": ("fp16", True),
    "fp16_conv_in_fp16": ("fp16", False),  # before vitlarge.model.vit.Fp32Conv2d: plain Conv2d under autocast
}


def _plain_conv(engine) -> None:
    model = engine.model
    while hasattr(model, "module"):  # Booster wrapper -> DDP -> the timm model
        model = model.module
    model.patch_embed.proj.__class__ = torch.nn.Conv2d


def run(quick: bool = True, tiny: bool = False) -> dict:
    tiny = results.is_tiny(tiny)
    threads = single_process(tiny)
    repeats, steps = (1, 1) if tiny else (3, 1) if quick else (5, 3)
    engines, batches = {}, None
    for name, (precision, as_built) in CONTENDERS.items():
        cfg = bench_config(tiny, precision)
        batches = batches or make_batches(cfg)
        engines[name] = build_engine(cfg)
        if not as_built:
            _plain_conv(engines[name])

    steppers = {name: engine_stepper(engine, batches) for name, engine in engines.items()}
    for step in steppers.values():  # warm-up: optimizer state, oneDNN primitive caches
        timing.per_step(step, steps)
    times = timing.interleaved_wall_cpu(
        {n: (lambda s=s: timing.per_step(s, steps)) for n, s in steppers.items()}, repeats
    )
    micro = bench_config(tiny).train.micro_batch
    res = timing.images_per_s(times, micro, threads)
    for r in res.values():
        r["speed_vs_fp32"] = round(r["images_per_s"] / res["fp32"]["images_per_s"], 3)
        r["speed_vs_fp32_cpu"] = round(r["images_per_s_cpu"] / res["fp32"]["images_per_s_cpu"], 3)
    cfg = bench_config(tiny)
    result = {
        "benchmark": "precision: step time by autocast dtype, CPU",
        **results.describe(cfg, tiny, quick, repeats, steps, threads, precision=False),
        "contenders": {
            k: {"precision": p, "patch_conv": "as built" if b else "Conv2d under autocast"}
            for k, (p, b) in CONTENDERS.items()
        },
        "results": res,
    }
    results.write_result("precision", result)
    return result


def show(r: dict) -> None:
    print(
        json.dumps(
            {
                k: {x: v[x] for x in ("images_per_s", "images_per_s_cpu", "speed_vs_fp32_cpu")}
                for k, v in r["results"].items()
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    results.cli(run, __doc__, show)
