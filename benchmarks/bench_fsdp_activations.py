"""Activation memory under ``fsdp`` with ``train.activation_checkpointing`` full and off, at world size 2 (gloo, CPU).

Question: How much activation memory does full recomputation (``train.activation_checkpointing=full``) save under
fsdp? (Its results keep the figures' names, ``grad_checkpointing=True|False``: the key's name before.)
Goal: no target: the figure is ``saved_ratio_on_over_off``.

Run: ``python -m benchmarks.bench_fsdp_activations [--quick] [--tiny]`` (~2 min on 2 cores). Writes
``benchmarks/results/fsdp_activations.json``. Not in the suite: on its own or ``python -m benchmarks.run --only fsdp_activations``.

Each rank builds ViT-S/16 on 128 px images (``--tiny``: the demo model) exactly as train.py does
(`vitlarge.train.assemble.build`, fp32, LAMB, ``train.plugin=fsdp``) and runs one micro-step (forward,
loss, backward) of 16 images. Two figures per setting, the settings run one after the other in
fresh processes:

* **saved for backward**: the bytes of every activation autograd keeps for backward during the forward
  (``torch.autograd.graph.saved_tensors_hooks``, each storage counted once; FSDP's gathered
  parameters are counted apart, ``params_saved``: they are freed after each block). With checkpointing,
  timm's non-reentrant ``checkpoint_seq`` keeps only each block's input (its own inner hooks take
  the rest), so this is the activation memory the recompute saves, exactly.
* **peak RSS growth**: ``ru_maxrss`` after the micro-step minus before it (the process's peak, so
  it includes FSDP's gathered block parameters and the backward's transients; noisy on a shared host).
"""

from __future__ import annotations

import resource

import torch

from benchmarks.harness import results  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)
from benchmarks.harness.loop import build_engine, make_batches
from benchmarks.harness.recipe import demo_config
from benchmarks.harness.spawn import spawn_gather

WORLD = 2
MICRO = 16


def config(checkpointing: bool, tiny: bool):
    return demo_config(
        {
            "train.activation_checkpointing": "full" if checkpointing else "off",
            "train.plugin": "fsdp",
            "train.precision": "fp32",
            "train.micro_batch": MICRO,
            "train.global_batch": MICRO * WORLD,
        },
        None if tiny else "vit_small_patch16_224",
        128,
    )


def _worker(rank: int, world: int, checkpointing: bool, tiny: bool) -> dict:
    import torch.distributed as dist

    cfg = config(checkpointing, tiny)
    engine = build_engine(cfg, world)
    model = engine.model.unwrap()  # the FSDP root
    ((x, y),) = make_batches(cfg, 1, seed=rank)
    storages = {False: {}, True: {}}  # is a (gathered) parameter -> storage -> bytes

    def pack(t):
        param = isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)
        storages[param][t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    dist.barrier()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()  # the recompute (with checkpointing) runs outside our hook: not counted as saved
    seen = {
        "saved_for_backward": sum(storages[False].values()),
        "params_saved": sum(storages[True].values()),
        "peak_rss_growth": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    return seen


def run(quick: bool = True, tiny: bool = False) -> dict:
    tiny = results.is_tiny(tiny)
    ranks = {}
    for checkpointing in (False, True, False, True)[: 2 if quick else 4]:  # interleaved: shared-host noise
        per_rank = spawn_gather(_worker, WORLD, checkpointing, tiny)
        ranks.setdefault(f"grad_checkpointing={checkpointing}", []).append(per_rank)
    fields = ("saved_for_backward", "params_saved", "peak_rss_growth", "peak_rss")
    summary = {key: {k: max(r[k] for rep in reps for r in rep) for k in fields} for key, reps in ranks.items()}
    off, on = summary["grad_checkpointing=False"], summary["grad_checkpointing=True"]
    result = {
        "model": "demo" if tiny else "vit_small_patch16_224@128px",
        "world_size": WORLD,
        "micro_batch": MICRO,
        "per_rank": ranks,
        "summary": summary,
        "saved_ratio_on_over_off": on["saved_for_backward"] / off["saved_for_backward"],
    }
    results.write_result("fsdp_activations", result)
    return result


def show(result: dict) -> None:
    print(
        f"model {result['model']}, fsdp, world size {result['world_size']}, micro-batch {result['micro_batch']}, fp32"
    )
    print("setting                    saved for backward MiB  peak RSS growth MiB  peak RSS MiB (max over ranks/reps)")
    for key, s in result["summary"].items():
        print(
            f"{key:26} {s['saved_for_backward'] / 2**20:22.1f} {s['peak_rss_growth'] / 2**20:20.0f}"
            f" {s['peak_rss'] / 2**20:13.0f}"
        )
    print(f"saved for backward, on / off: {result['saved_ratio_on_over_off']:.3f}")


if __name__ == "__main__":
    results.cli(run, __doc__, show)
