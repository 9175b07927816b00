"""Gradient memory of ``fsdp`` accumulation: ``no_sync`` vs ``reduce_scatter`` (``train.fsdp_accumulation``).

Run: ``python -m benchmarks.bench_fsdp_accumulation [--quick] [--tiny]`` (~2 min on 2 cores). Writes
``benchmarks/results/fsdp_accumulation.json``. Not part of ``benchmarks.run``: run it on its own.

World size 2 (gloo, CPU), fp32, 2 micro-steps of 2 images per optimizer step, the real engine
(`vitlarge.train.assemble.build`). Models: the demo ViT and ViT-B/16 on 64 px images (``--tiny``: the demo
only). Measured between the two micro-steps (inside the engine's ``next_batch`` call for the
second one), on every rank: the bytes of gradient storage FSDP2 holds, each storage once: every
parameter's unsharded gradient (``unsharded_accumulated_grad`` or the unsharded parameter's ``grad``,
under ``no_sync``) and its sharded DTensor ``grad`` (the accumulator under ``reduce_scatter``);
torch 2.10's FSDP2 attribute names.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from benchmarks import common  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)

ROOT = Path(__file__).resolve().parent.parent
WORLD, MICRO, ACCUM = 2, 2, 2
MODES = ("no_sync", "reduce_scatter")


def config(model: str, mode: str):
    from vitlarge.config.load import load_recipe

    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    if model != "demo":
        cfg.model.name, cfg.model.kwargs = model, {}
        cfg.data.image_size, cfg.data.num_classes = 64, 1000
    cfg.train.plugin, cfg.train.precision, cfg.train.fsdp_accumulation = "fsdp", "fp32", mode
    cfg.train.micro_batch, cfg.train.global_batch = MICRO, MICRO * ACCUM * WORLD
    cfg.augment.mixup_alpha = 0.0
    cfg.data.num_train_examples = 10**6
    return cfg


def grad_bytes(model: torch.nn.Module) -> int:
    from torch.distributed.fsdp import FSDPModule

    storages = {}
    for m in model.modules():
        group = m._get_fsdp_state()._fsdp_param_group if isinstance(m, FSDPModule) else None
        for fp in group.fsdp_params if group else ():
            unsharded = getattr(fp, "_unsharded_param", None)
            sharded = fp.sharded_param.grad
            for t in (
                fp.unsharded_accumulated_grad,
                None if unsharded is None else unsharded.grad,
                None if sharded is None else sharded.to_local(),
            ):
                if t is not None:
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _worker(rank: int, port: int, model: str, mode: str, out: str) -> None:
    import torch.distributed as dist

    from benchmarks.bench_train import build_engine
    from vitlarge.distributed import launch, launcher

    torch.set_num_threads(1)
    launch.init_distributed(launcher.DistEnv(rank, WORLD, rank, "127.0.0.1", port, "bench"), "gloo")
    cfg = config(model, mode)
    engine = build_engine(cfg, WORLD)
    g = torch.Generator().manual_seed(rank)
    s = cfg.data.image_size
    batch = (torch.randn(MICRO, 3, s, s, generator=g), torch.randint(0, cfg.data.num_classes, (MICRO,), generator=g))
    seen, calls = {}, [0]

    def next_batch():
        if calls[0] == 1:  # between micro-steps: what accumulation holds
            seen["between_micro_steps"] = grad_bytes(engine.model.unwrap())
        calls[0] += 1
        return batch

    engine.step(0, next_batch)
    seen["params"] = sum(p.to_local().numel() for p in engine.model.parameters()) * 4  # this rank's fp32 shard
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, seen)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def run(quick: bool = True, tiny: bool = False) -> dict:
    import torch.multiprocessing as mp

    from vitlarge.distributed import launcher

    models = ("demo",) if common.is_tiny(tiny) else ("demo", "vit_base_patch16_224")
    ranks, summary = {}, {}
    for model in models:
        for mode in MODES:
            out = tempfile.mktemp(prefix="vitlarge-bench-accum-", suffix=".json")
            mp.spawn(_worker, args=(launcher.free_port(), model, mode, out), nprocs=WORLD, join=True)
            ranks[f"{model}/{mode}"] = per_rank = json.loads(Path(out).read_text())
            os.unlink(out)
            summary[f"{model}/{mode}"] = {k: max(r[k] for r in per_rank) for k in ("between_micro_steps", "params")}
    result = {"world_size": WORLD, "micro_batch": MICRO, "accum_steps": ACCUM, "per_rank": ranks, "summary": summary}
    common.write_result("fsdp_accumulation", result)
    return result


def show(result: dict) -> None:
    print(
        f"fsdp, world size {result['world_size']}, fp32, {result['accum_steps']} micro-steps of {result['micro_batch']}"
    )
    print("model/mode                         gradient MiB between micro-steps  param shard MiB (max over ranks)")
    for key, s in result["summary"].items():
        print(f"{key:34} {s['between_micro_steps'] / 2**20:32.1f} {s['params'] / 2**20:17.1f}")


if __name__ == "__main__":
    common.cli(run, __doc__, show)
