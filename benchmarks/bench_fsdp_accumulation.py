"""Gradient memory of ``fsdp`` accumulation: ``no_sync`` vs ``reduce_scatter`` (``train.fsdp_accumulation``).

Question: How much gradient memory does each ``train.fsdp_accumulation`` mode hold between micro-
steps?
Goal: no target: the figure is ``summary[model/mode].between_micro_steps`` (reduce_scatter ~ 1/W of
no_sync).

Run: ``python -m benchmarks.bench_fsdp_accumulation [--quick] [--tiny]`` (~2 min on 2 cores). Writes
``benchmarks/results/fsdp_accumulation.json``. Not in the suite: on its own or ``python -m benchmarks.run --only fsdp_accumulation``.

World size 2 (gloo, CPU), fp32, 2 micro-steps of 2 images per optimizer step, the real engine
(`vitlarge.train.assemble.build`). Models: the demo ViT and ViT-B/16 on 64 px images (``--tiny``: the demo
only). Measured between the two micro-steps (inside the engine's ``next_batch`` call for the
second one), on every rank: the bytes of gradient storage FSDP2 holds, each storage once: every
parameter's unsharded gradient (``unsharded_accumulated_grad`` or the unsharded parameter's ``grad``,
under ``no_sync``) and its sharded DTensor ``grad`` (the accumulator under ``reduce_scatter``);
torch 2.10's FSDP2 attribute names.
"""

from __future__ import annotations

import torch

from benchmarks.harness import results  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)
from benchmarks.harness.loop import build_engine, make_batches
from benchmarks.harness.recipe import demo_config
from benchmarks.harness.spawn import spawn_gather

WORLD, MICRO, ACCUM = 2, 2, 2
MODES = ("no_sync", "reduce_scatter")


def config(model: str, mode: str):
    return demo_config(
        {
            "train.plugin": "fsdp",
            "train.precision": "fp32",
            "train.fsdp_accumulation": mode,
            "train.micro_batch": MICRO,
            "train.global_batch": MICRO * ACCUM * WORLD,
        },
        None if model == "demo" else model,
        64,
    )


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


def _worker(rank: int, world: int, model: str, mode: str) -> dict:
    cfg = config(model, mode)
    engine = build_engine(cfg, world)
    (batch,) = make_batches(cfg, 1, seed=rank)
    seen, calls = {}, [0]

    def next_batch():
        if calls[0] == 1:  # between micro-steps: what accumulation holds
            seen["between_micro_steps"] = grad_bytes(engine.model.unwrap())
        calls[0] += 1
        return batch

    engine.step(0, next_batch)
    seen["params"] = sum(p.to_local().numel() for p in engine.model.parameters()) * 4  # this rank's fp32 shard
    return seen


def run(quick: bool = True, tiny: bool = False) -> dict:
    models = ("demo",) if results.is_tiny(tiny) else ("demo", "vit_base_patch16_224")
    ranks, summary = {}, {}
    for model in models:
        for mode in MODES:
            ranks[f"{model}/{mode}"] = per_rank = spawn_gather(_worker, WORLD, model, mode)
            summary[f"{model}/{mode}"] = {k: max(r[k] for r in per_rank) for k in ("between_micro_steps", "params")}
    result = {"world_size": WORLD, "micro_batch": MICRO, "accum_steps": ACCUM, "per_rank": ranks, "summary": summary}
    results.write_result("fsdp_accumulation", result)
    return result


def show(result: dict) -> None:
    print(
        f"fsdp, world size {result['world_size']}, fp32, {result['accum_steps']} micro-steps of {result['micro_batch']}"
    )
    print("model/mode                         gradient MiB between micro-steps  param shard MiB (max over ranks)")
    for key, s in result["summary"].items():
        print(f"{key:34} {s['between_micro_steps'] / 2**20:32.1f} {s['params'] / 2**20:17.1f}")


if __name__ == "__main__":
    results.cli(run, __doc__, show)
