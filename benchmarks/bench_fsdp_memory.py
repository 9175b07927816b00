"""Per-rank memory of ``ddp`` vs ``fsdp`` at world size 1, 2 and 3, on real gloo processes (CPU).

Question: Does fsdp shard the training state: per-rank bytes ~ 1/W of the unsharded total?
Goal: ``summary[fsdp/W].ratio_to_unsharded_over_world`` <= 1.10.

Run: ``python -m benchmarks.bench_fsdp_memory [--quick] [--tiny]`` (~2 min on 2 cores). Writes
``benchmarks/results/fsdp_memory.json``. Not in the suite: on its own or ``python -m benchmarks.run --only fsdp_memory``.

Each rank builds ViT-S/16 on 32 px images (22M parameters; ``--tiny``: the demo model) exactly as
train.py does (`vitlarge.train.assemble.build`, fp32, LAMB) and takes 2 optimizer steps on in-memory
batches. The state bytes are measured directly, not inferred from RSS: in an optimizer-step
pre-hook (the moment gradients, weights and LAMB moments all exist) we sum the bytes of this rank's
parameter tensors (under FSDP2: the local pieces of its DTensors), their gradients and every tensor in
the optimizer state. The goal: fsdp's parameter + gradient + optimizer bytes per rank
within 10% of 1/W of the unsharded total. Peak RSS is reported too (it includes ~0.5 GB of
Python, torch and Colossal-AI, and FSDP's gathered blocks during forward/backward).
"""

from __future__ import annotations

import resource

import torch

from benchmarks.harness import results  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)
from benchmarks.harness.loop import build_engine, make_batches
from benchmarks.harness.recipe import demo_config
from benchmarks.harness.spawn import spawn_gather

WORLDS = (1, 2, 3)
PLUGINS = ("ddp", "fsdp")


def config(plugin: str, world: int, tiny: bool):
    return demo_config(
        {
            "train.plugin": plugin,
            "train.precision": "fp32",
            "train.micro_batch": 4,
            "train.global_batch": 4 * world,
        },
        None if tiny else "vit_small_patch16_224",
        32,
    )


def nbytes(tensors) -> int:
    """Bytes this rank holds: a DTensor (FSDP2) counts its local piece."""
    from torch.distributed.tensor import DTensor

    local = (t.to_local() if isinstance(t, DTensor) else t for t in tensors if isinstance(t, torch.Tensor))
    return sum(t.numel() * t.element_size() for t in local)


def _worker(rank: int, world: int, plugin: str, tiny: bool) -> dict:
    cfg = config(plugin, world, tiny)
    engine = build_engine(cfg, world)
    opt = engine.torch_optimizer
    seen = {}

    def measure(optimizer, args, kwargs):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        seen.update(
            params=nbytes(params),
            grads=nbytes(p.grad for p in params if p.grad is not None),
            optimizer=nbytes(v for s in optimizer.state.values() for v in s.values()),
        )

    opt.register_step_pre_hook(measure)
    (batch,) = make_batches(cfg, 1, seed=rank)
    for step in range(2):  # the second step sees the LAMB moments the first created
        engine.step(step, lambda: batch)
    seen["total"] = seen["params"] + seen["grads"] + seen["optimizer"]
    seen["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seen["model_params"] = sum(p.numel() for p in engine.model.parameters())
    return seen


def run(quick: bool = True, tiny: bool = False) -> dict:
    tiny = results.is_tiny(tiny)
    ranks = {}
    for plugin in PLUGINS:
        for world in WORLDS:
            ranks[f"{plugin}/{world}"] = spawn_gather(_worker, world, plugin, tiny)
    unsharded = ranks["ddp/1"][0]["total"]
    summary = {}
    for key, per_rank in ranks.items():
        world = int(key.split("/")[1])
        worst = max(r["total"] for r in per_rank)
        summary[key] = {
            "state_bytes_per_rank_max": worst,
            "ratio_to_unsharded_over_world": worst / (unsharded / world),
            "peak_rss_max": max(r["peak_rss"] for r in per_rank),
        }
    result = {
        "model": "demo" if tiny else "vit_small_patch16_224@32px",
        "unsharded_state_bytes": unsharded,
        "per_rank": ranks,
        "summary": summary,
    }
    results.write_result("fsdp_memory", result)
    return result


def show(result: dict) -> None:
    print(
        f"model {result['model']}: unsharded params+grads+LAMB states {result['unsharded_state_bytes'] / 2**20:.1f} MiB"
    )
    print("plugin/W  state MiB per rank (max)  x (unsharded/W)  peak RSS MiB (max)")
    for key, s in result["summary"].items():
        print(
            f"{key:8}  {s['state_bytes_per_rank_max'] / 2**20:24.1f}  {s['ratio_to_unsharded_over_world']:15.3f}"
            f"  {s['peak_rss_max'] / 2**20:18.0f}"
        )


if __name__ == "__main__":
    results.cli(run, __doc__, show)
