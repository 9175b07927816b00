"""Gradient all-reduces per optimizer step at accumulation 1, 4 and 32, on 2 real gloo processes.

Question: Does gradient accumulation add gradient all-reduces, or is there one per DDP bucket per
optimizer step?
Goal: ``calls_independent_of_accumulation`` and ``prediction_matches_measurement`` both true.

Run: ``python -m benchmarks.bench_comm [--quick]`` (CPU, 2 processes, ~30 s). Writes
``benchmarks/results/comm.json``.

Each rank builds the demo model (``recipes/demo_digits.py``, 0.45M parameters: one bucket) and, unless
tiny, ViT-S/16 on 32 px images (22M parameters: four buckets) through the Engine as
train.py does (Booster + TorchDDPPlugin, bucket cap 25 MB) and takes optimizer steps on in-memory
batches; the Engine's ``CommCounter`` DDP comm hook counts the gradient all-reduce calls and bytes
per step. Every micro-step but the last runs under ``no_sync``, so the count must be the number of
DDP buckets whatever the accumulation. The Trainer adds one 8-byte all-reduce per step (loss and
stop flag), not counted here.

For ViT-B/16 and ViT-L/16 the buckets are computed, not run: DDP's own assignment
(``dist._compute_bucket_assignment_by_size``, 25 MB cap; with an explicit ``bucket_cap_mb`` DDP
adds no small first bucket) over the parameters in
reverse order, which is how DDP rebuilds its buckets after the first step. The same computation
for the demo model is checked against the measured count.
"""

from __future__ import annotations

import torch

from benchmarks.harness import recipe, results  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)
from benchmarks.harness.loop import build_engine, make_batches
from benchmarks.harness.spawn import spawn_gather
from vitlarge.distributed.plugins import DDP_BUCKET_CAP_MB as BUCKET_CAP_MB

ACCUMULATIONS = (1, 4, 32)
WORLD = 2


def demo_config(accum: int, tiny: bool, model: str = "demo"):
    """The demo recipe at ``accum`` micro-steps per optimizer step; ``model="vit_s16"`` swaps in
    ViT-S/16 (22M parameters, 88 MB of gradients: several 25 MB buckets) on 32 px images."""
    micro = 2 if tiny else 8
    return recipe.demo_config(
        {
            "train.micro_batch": micro,
            "train.global_batch": micro * accum * WORLD,
            "train.precision": "fp32",
        },
        "vit_small_patch16_224" if model == "vit_s16" else None,
        32,
    )


def _worker(rank: int, world: int, steps: int, tiny: bool) -> dict:
    measured = {}
    models = ("demo",) if tiny else ("demo", "vit_s16")
    for model, accum in [(m, a) for m in models for a in ACCUMULATIONS]:
        cfg = demo_config(accum, tiny, model)
        engine = build_engine(cfg, world)
        (batch,) = make_batches(cfg, 1, seed=rank)
        calls, nbytes = [], []
        for step in range(steps):
            c0, b0 = engine.comm.calls, engine.comm.bytes
            engine.step(step, lambda: batch)
            calls.append(engine.comm.calls - c0)
            nbytes.append(engine.comm.bytes - b0)
        ddp = engine.model.module
        log = ddp._get_ddp_logging_data()
        measured.setdefault(model, {})[accum] = {
            "calls_per_step": calls,
            "bytes_per_step": nbytes,
            "micro_steps_per_step": accum,
            "grad_bytes": sum(p.numel() * p.element_size() for p in ddp.parameters()),
            "params": sum(p.numel() for p in ddp.parameters()),
            "ddp_bucket_sizes": log.get("bucket_sizes"),
            "ddp_rebuilt_bucket_sizes": log.get("rebuilt_bucket_sizes"),
        }
        del engine
    return measured


def ddp_buckets(model: torch.nn.Module, cap_mb: int = BUCKET_CAP_MB) -> list[int]:
    """Bucket sizes in bytes as DDP lays them out after its first step (gradient-ready order)."""
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad][::-1]
    # An explicit bucket_cap_mb (ours) also caps the first bucket; only DDP's default adds a 1 MB one.
    limits = [cap_mb * 1024 * 1024]
    buckets, _ = dist._compute_bucket_assignment_by_size(params, limits, [False] * len(params))
    return [sum(params[i].numel() * params[i].element_size() for i in b) for b in buckets]


def computed(name: str, **kwargs) -> dict:
    import timm

    with torch.device("meta"):
        model = timm.create_model(name, **kwargs)
    sizes = ddp_buckets(model)
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "buckets": len(sizes),
        "bytes_per_step": sum(sizes),
        "bucket_bytes": sizes,
    }


def run(quick: bool = True, tiny: bool = False) -> dict:
    from vitlarge.model.vit import build_model

    tiny = results.is_tiny(tiny)
    steps = 2 if tiny else 3
    all_measured = spawn_gather(_worker, WORLD, steps, tiny)[0]  # rank 0's counts
    measured = {int(k): v for k, v in all_measured["demo"].items()}
    demo_cfg = demo_config(1, tiny)
    demo_pred = ddp_buckets(build_model(demo_cfg, "meta"))
    # After DDP's first step it rebuilds its buckets in gradient-ready order; steps 2.. are steady.
    steady = {a: {"calls": m["calls_per_step"][-1], "bytes": m["bytes_per_step"][-1]} for a, m in measured.items()}
    one_per_step = len({s["calls"] for s in steady.values()}) == 1 and all(
        len(set(m["calls_per_step"][1:])) == 1 for m in measured.values()
    )
    multi = None
    if "vit_s16" in all_measured:  # several buckets: the count is the bucket count, not 1
        ms = {int(k): v for k, v in all_measured["vit_s16"].items()}
        pred = ddp_buckets(build_model(demo_config(1, tiny, "vit_s16"), "meta"))
        multi = {
            "params": ms[1]["params"],
            "grad_bytes": ms[1]["grad_bytes"],
            "predicted_buckets": len(pred),
            "predicted_bucket_bytes": pred,
            "measured": ms,
            "steady_per_step": {
                a: {"calls": m["calls_per_step"][-1], "bytes": m["bytes_per_step"][-1]} for a, m in ms.items()
            },
        }
        multi["matches"] = all(s["calls"] == len(pred) for s in multi["steady_per_step"].values())
        one_per_step = one_per_step and len({s["calls"] for s in multi["steady_per_step"].values()}) == 1
    result = {
        "benchmark": "gradient all-reduces per optimizer step (DDP comm hook), 2 gloo processes",
        "world_size": WORLD,
        "bucket_cap_mb": BUCKET_CAP_MB,
        "tiny": tiny,
        "quick": quick,
        "steps": steps,
        "demo_model": {
            "name": demo_cfg.model.name,
            "kwargs": demo_cfg.model.kwargs,
            "params": measured[1]["params"],
            "grad_bytes": measured[1]["grad_bytes"],
            "predicted_buckets": len(demo_pred),
            "predicted_bucket_bytes": demo_pred,
        },
        "measured": measured,
        "steady_per_step": steady,
        "calls_independent_of_accumulation": one_per_step,
        "prediction_matches_measurement": all(s["calls"] == len(demo_pred) for s in steady.values())
        and (multi is None or multi["matches"]),
        "vit_s16_32px": multi,
        "computed": {
            "vit_base_patch16_224": computed("vit_base_patch16_224"),
            "vit_large_patch16_224": computed("vit_large_patch16_224"),
        },
        "goal": "calls per optimizer step = number of DDP buckets, independent of accumulation",
    }
    results.write_result("comm", result)
    return result


def show(r: dict) -> None:
    for a, s in r["steady_per_step"].items():
        print(
            f"accumulation {a:3d}: {s['calls']} all-reduce calls, {s['bytes']:,} bytes per optimizer step "
            f"(all steps: {r['measured'][a]['calls_per_step']})"
        )
    if r["vit_s16_32px"]:
        v = r["vit_s16_32px"]
        print(f"ViT-S/16: {v['steady_per_step']} (predicted {v['predicted_buckets']} buckets)")
    for name, c in r["computed"].items():
        print(f"{name}: {c['params']:,} params -> {c['buckets']} buckets, {c['bytes_per_step']:,} bytes per step")
    print(
        f"calls independent of accumulation: {r['calls_independent_of_accumulation']}; "
        f"predicted buckets match: {r['prediction_matches_measurement']}"
    )


if __name__ == "__main__":
    results.cli(run, __doc__, show)
