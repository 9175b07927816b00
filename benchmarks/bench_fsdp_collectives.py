"""Collectives per micro-step and per optimizer step under ``fsdp`` (world size 2, gloo, CPU).

Question: How many collectives does fsdp issue per micro-step and per optimizer step?
Goal: no target: the figures are ``summary[model].per_micro_step`` and ``per_optimizer_step``.

Run: ``python -m benchmarks.bench_fsdp_collectives [--quick] [--tiny]`` (~1 min on 2 cores). Writes
``benchmarks/results/fsdp_collectives.json``. Not in the suite: on its own or ``python -m benchmarks.run --only fsdp_collectives``.

Each rank builds the model train.py builds (`vitlarge.train.assemble.build`, ``train.plugin=fsdp``, bf16,
``train.fsdp_accumulation=reduce_scatter``), takes one warm-up step (FSDP's lazy init), then counts
the calls of ``torch.distributed.all_gather_into_tensor`` and ``all_gather`` (FSDP1's CPU path used
the latter), ``reduce_scatter_tensor``, ``all_reduce`` and the functional ``all_reduce`` DTensor uses
for the gradient norm (the functions are called through their modules, so patching them counts every
call) during one optimizer step of 1 micro-step and one of 2. Per micro-step = the difference; per
optimizer step = the rest (gradient-norm clipping, LAMB's trust-ratio all-reduce). Models: the demo
ViT (4 blocks) and ViT-S/16 at 32 px (12 blocks; ``--tiny``: the demo only).
"""

from __future__ import annotations

from collections import Counter

from benchmarks.harness import results  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)
from benchmarks.harness.loop import build_engine, make_batches
from benchmarks.harness.recipe import demo_config
from benchmarks.harness.spawn import spawn_gather

WORLD, MICRO = 2, 2
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
PATCHED = (
    ("dist", "all_gather_into_tensor", "all_gather"),
    ("dist", "all_gather", "all_gather"),
    ("dist", "reduce_scatter_tensor", "reduce_scatter"),
    ("dist", "all_reduce", "all_reduce"),
    ("funcol", "all_reduce", "all_reduce"),
)


def config(model: str, accum: int):
    return demo_config(
        {
            "train.plugin": "fsdp",
            "train.precision": "bf16",
            "train.fsdp_accumulation": "reduce_scatter",
            "train.micro_batch": MICRO,
            "train.global_batch": MICRO * accum * WORLD,
        },
        None if model == "demo" else model,
        32,
    )


def _worker(rank: int, world: int, model: str) -> dict:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    counts, counting = Counter(), [False]
    for module, name, label in PATCHED:
        module = {"dist": dist, "funcol": funcol}[module]
        real = getattr(module, name)

        def counted(*args, _real=real, _label=label, **kwargs):
            if counting[0]:
                counts[_label] += 1
            return _real(*args, **kwargs)

        setattr(module, name, counted)
    seen = {}
    for accum in (1, 2):
        cfg = config(model, accum)
        engine = build_engine(cfg, world)
        (batch,) = make_batches(cfg, 1, seed=rank)
        engine.step(0, lambda: batch)  # lazy init
        counts.clear()
        counting[0] = True
        engine.step(1, lambda: batch)
        counting[0] = False
        seen[accum] = dict(counts)
    seen["depth"] = len(getattr(engine.model.unwrap(), "blocks", []))
    return seen  # its keys become strings ("1", "2") on the way back (JSON)


def run(quick: bool = True, tiny: bool = False) -> dict:
    models = ("demo",) if results.is_tiny(tiny) else ("demo", "vit_small_patch16_224")
    summary = {}
    for model in models:
        seen = spawn_gather(_worker, WORLD, model)[0]  # rank 0's counts
        one, two = seen["1"], seen["2"]
        summary[model] = {
            "depth": seen["depth"],
            "per_micro_step": {c: two.get(c, 0) - one.get(c, 0) for c in COLLECTIVES},
            "per_optimizer_step": {c: 2 * one.get(c, 0) - two.get(c, 0) for c in COLLECTIVES},
        }
    result = {"world_size": WORLD, "precision": "bf16", "fsdp_accumulation": "reduce_scatter", "summary": summary}
    results.write_result("fsdp_collectives", result)
    return result


def show(result: dict) -> None:
    print(f"fsdp, world size {result['world_size']}, {result['precision']}, {result['fsdp_accumulation']}")
    print("model                    depth  per micro-step (all-gather / reduce-scatter / all-reduce)  per step")
    for model, s in result["summary"].items():
        m, o = s["per_micro_step"], s["per_optimizer_step"]
        print(
            f"{model:24} {s['depth']:5}  {' / '.join(str(m[c]) for c in COLLECTIVES):>20}"
            f"  {' / '.join(str(o[c]) for c in COLLECTIVES):>30}"
        )


if __name__ == "__main__":
    results.cli(run, __doc__, show)
