"""Collectives per micro-step and per optimizer step under ``fsdp`` (world size 2, gloo, CPU).

Run: ``python -m benchmarks.bench_fsdp_collectives [--quick] [--tiny]`` (~1 min on 2 cores). Writes
``benchmarks/results/fsdp_collectives.json``. Not part of ``benchmarks.run``: run it on its own.

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

import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import torch

from benchmarks import common  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)

ROOT = Path(__file__).resolve().parent.parent
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
    from vitlarge.config.load import load_recipe

    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    if model != "demo":
        cfg.model.name, cfg.model.kwargs = model, {}
        cfg.data.image_size, cfg.data.num_classes = 32, 1000
    cfg.train.plugin, cfg.train.precision, cfg.train.fsdp_accumulation = "fsdp", "bf16", "reduce_scatter"
    cfg.train.micro_batch, cfg.train.global_batch = MICRO, MICRO * accum * WORLD
    cfg.augment.mixup_alpha = 0.0
    cfg.data.num_train_examples = 10**6
    return cfg


def _worker(rank: int, port: int, model: str, out: str) -> None:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from benchmarks.bench_train import build_engine
    from vitlarge.distributed import launch, launcher

    torch.set_num_threads(1)
    launch.init_distributed(launcher.DistEnv(rank, WORLD, rank, "127.0.0.1", port, "bench"), "gloo")
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
        engine = build_engine(cfg, WORLD)
        g = torch.Generator().manual_seed(rank)
        s = cfg.data.image_size
        batch = (
            torch.randn(MICRO, 3, s, s, generator=g),
            torch.randint(0, cfg.data.num_classes, (MICRO,), generator=g),
        )
        engine.step(0, lambda: batch)  # lazy init
        counts.clear()
        counting[0] = True
        engine.step(1, lambda: batch)
        counting[0] = False
        seen[accum] = dict(counts)
    seen["depth"] = len(getattr(engine.model.unwrap(), "blocks", []))
    if rank == 0:
        Path(out).write_text(json.dumps(seen))
    dist.destroy_process_group()


def run(quick: bool = True, tiny: bool = False) -> dict:
    import torch.multiprocessing as mp

    from vitlarge.distributed import launcher

    models = ("demo",) if common.is_tiny(tiny) else ("demo", "vit_small_patch16_224")
    summary = {}
    for model in models:
        out = tempfile.mktemp(prefix="vitlarge-bench-coll-", suffix=".json")
        mp.spawn(_worker, args=(launcher.free_port(), model, out), nprocs=WORLD, join=True)
        seen = json.loads(Path(out).read_text())
        os.unlink(out)
        one, two = seen["1"], seen["2"]
        summary[model] = {
            "depth": seen["depth"],
            "per_micro_step": {c: two.get(c, 0) - one.get(c, 0) for c in COLLECTIVES},
            "per_optimizer_step": {c: 2 * one.get(c, 0) - two.get(c, 0) for c in COLLECTIVES},
        }
    result = {"world_size": WORLD, "precision": "bf16", "fsdp_accumulation": "reduce_scatter", "summary": summary}
    common.write_result("fsdp_collectives", result)
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
    common.cli(run, __doc__, show)
