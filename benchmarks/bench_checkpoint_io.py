"""Bytes each rank reads, and its peak host memory, when it resumes a checkpoint (ddp and fsdp, 2 and 3 ranks).

Question: What does each rank read, and how much host memory does it need, to resume a checkpoint?
Goal: no target: the figures are ``read_MB_per_rank`` and ``peak_MB_per_rank`` per row.

Run: ``python -m benchmarks.bench_checkpoint_io [--root DIR]`` (CPU, gloo, ~5 min on 2 cores). Writes
``benchmarks/results/checkpoint_io.json`` and prints a table. ``--root`` points at another checkout's
``vitlarge`` (e.g. a ``git worktree`` of an older commit) to measure its checkpoint code with the same harness: the script
calls only ``store.save`` / ``store.load`` (through `_save_and_load`: with a ``RunState``, or a checkout's older
per-part signatures).

Model: ViT-S/16 (timm ``vit_small_patch16_224`` at 32 px: 21.7M parameters, 87 MB fp32) with LAMB
(two moments: 174 MB), as train.py builds it for ``train.plugin=ddp`` (plain module, `vitlarge.optim.lamb`)
and ``train.plugin=fsdp`` (`vitlarge.distributed.fsdp.wrap`, ShardedLamb). One optimizer step, a save at 2 ranks, then
every load in a fresh set of processes (so the peaks do not mix).

Measured per rank around ``store.load`` only:

* ``read_MB``: ``rchar`` of ``/proc/self/io`` (bytes through read()/pread(), page cache or not), plus
  the size of every ``model.safetensors`` the rank loads: safetensors maps the file and copies each
  tensor out of the mapping, so its bytes are read but never pass read().
* ``peak_MB``: ``VmHWM - VmRSS`` of ``/proc/self/status`` after resetting VmHWM (``clear_refs`` 5) just
  before the load: the host memory the load needed beyond what the run already held.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.harness.recipe import bench_config
from benchmarks.harness.spawn import spawn_gather

HERE = Path(__file__).resolve().parent
MODEL_KWARGS = dict(img_size=32, num_classes=10)


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _rchar() -> int:
    return int(
        next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar:")).split()[1]
    )


def _build(plugin: str):
    import timm

    from vitlarge.config.schema import OptimConfig
    from vitlarge.optim.lamb import build_optimizer

    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", **MODEL_KWARGS)
    opt = build_optimizer(model, OptimConfig(lr=1e-3, weight_decay=0.05))
    if plugin == "fsdp":  # as train.py builds it (the plugin shards, re-points and swaps the optimizer)
        from vitlarge.distributed.fsdp import FSDPPlugin

        return FSDPPlugin("fp32", torch.device("cpu")).configure(model, opt)[:2]
    from torch.nn.parallel import DistributedDataParallel as DDP

    return _Booster(DDP(model)), opt


class _Booster(torch.nn.Module):
    """What the Booster hands the checkpoint code under ddp: a wrapper whose ``unwrap()`` is the module."""

    def __init__(self, ddp):
        super().__init__()
        self.ddp = ddp

    def forward(self, x):
        return self.ddp(x)

    def unwrap(self):
        return self.ddp.module


def _worker(rank: int, world: int, root: str, plugin: str, action: str, workdir: str) -> dict:
    sys.path.insert(0, root)  # before any vitlarge import: the group is up without one (plain_init)
    from vitlarge.checkpoint import store

    model, opt = _build(plugin)
    cfg = bench_config("demo_digits", {"model.name": "vit_small_patch16_224"})
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    save, load = _save_and_load(store, model, opt, scaler, cfg)
    result = {}
    if action == "save":
        x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        save(workdir)
    else:
        path = Path(action)
        mapped = (path / "model.safetensors").stat().st_size if (path / "model.safetensors").exists() else 0
        dist.barrier()
        Path(f"/proc/{os.getpid()}/clear_refs").write_text("5")  # VmHWM := VmRSS
        rss, rchar = _status("VmRSS"), _rchar()
        load(path)
        result = {"read_MB": (_rchar() - rchar + mapped) / 1e6, "peak_MB": (_status("VmHWM") - rss) / 1e6}
    return result


def _save_and_load(store, model, opt, scaler, cfg):
    """``(save(workdir), load(path))`` of the measured checkout's store: a ``RunState``, or before it (fe31341 and
    older) the parts one by one."""
    try:
        from vitlarge.checkpoint.state import RunState
    except ImportError:
        return (
            lambda workdir: store.save(workdir, 1, model, opt, scaler, None, cfg, keep=1),
            lambda path: store.load(path, model, opt, scaler, cfg),
        )
    state = RunState(model, opt, scaler, step=1)
    return lambda workdir: store.save(workdir, state, cfg, keep=1), lambda path: store.load(path, state, cfg)


def _spawn(world, root, plugin, action, workdir):
    """The workers import vitlarge from ``root`` (spawned processes: this one's imports do not carry over)."""
    return spawn_gather(_worker, world, root, plugin, action, str(workdir), plain_init=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(HERE.parent), help="checkout whose vitlarge is measured")
    p.add_argument("--out", default=str(HERE / "results" / "checkpoint_io.json"))
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for saved in ("ddp", "fsdp"):
            _spawn(2, args.root, saved, "save", tmp / saved)
            ckpt = tmp / saved / "checkpoints" / "step_0000001"
            size = sum(f.stat().st_size for f in ckpt.iterdir()) / 1e6
            for plugin, world in ((saved, 2), (saved, 3), ("fsdp" if saved == "ddp" else "ddp", 3)):
                per_rank = _spawn(world, args.root, plugin, str(ckpt), None)
                rows.append(
                    {
                        "saved": f"{saved}@2",
                        "loaded": f"{plugin}@{world}",
                        "checkpoint_MB": round(size, 1),
                        "read_MB_per_rank": [round(r["read_MB"], 1) for r in per_rank],
                        "peak_MB_per_rank": [round(r["peak_MB"], 1) for r in per_rank],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"root": args.root, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
