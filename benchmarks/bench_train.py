"""Training-loop overhead and MFU on the CPU: train.py's steps vs a bare PyTorch loop.

Question: What does train.py's loop cost over a bare PyTorch loop, and how much of the CPU's matmul
rate does a step use?
Goal: ``speed_vs_bare`` (or ``speed_vs_bare_cpu``) >= 0.97 and ``mfu.mfu_vs_bf16_matmul`` >= 0.30.

Run: ``python -m benchmarks.bench_train [--quick]`` (CPU, 2 threads, ~2-4 min quick on an idle
machine). Writes ``benchmarks/results/train.json``.

Both sides train the same model (ViT-S/16 at 96 px, 1000 classes, micro-batch 32, bf16 autocast,
recipe dropouts), with vitlarge's LAMB, clipping at 1.0, on the same pre-made in-memory batches (no
DALI on either side: this measures the loop, not the input):

- ``vitlarge``: train.py's wiring, `vitlarge.train.assemble.build` (model, optimizer, ``Booster(TorchDDPPlugin)``)
  on a gloo process group of world size 1, ``Engine`` and ``Trainer.fit`` with the default hooks
  (metrics.jsonl, TensorBoard, NaN guard; no console) and the per-step loss all-reduce.
- ``bare``: model, autocast, GradScaler, ``clip_grad_norm_``, ``optimizer.step()``; no DDP.

Each round times ``steps`` optimizer steps of each side, interleaved, after one warm-up step each;
we report the median over rounds of the mean step time, wall and CPU (CPU seconds of the process
divided by its threads is what an idle machine would show; on a shared machine it is the steadier
number). Goal: vitlarge >= 0.97x the bare loop's images/s.

MFU: FLOPs of one training step (``FlopCounterMode`` over forward and backward; 3x forward is
also given) per second of the bf16 step, against the measured bf16 matmul FLOP/s of this machine
(a large ``torch.matmul``, 2 threads). A profile of one bare step splits the time by op kind
(matmul, attention, layer norm, GELU, casts, optimizer...) and gives the FLOP/s the model's own
matmuls reach, which is what says why the MFU is what it is. Goal: >= 30%.
"""

from __future__ import annotations

import json
import tempfile
import time

import torch

from benchmarks.harness import results, timing  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)
from benchmarks.harness.loop import (
    BareLoop,
    InMemoryLoader,
    build_engine,
    make_batches,
    single_process,
    vitlarge_optimizer,
)
from benchmarks.harness.recipe import bench_config as recipe_config
from vitlarge.events import Hook


class StopBench(Exception):
    """Raised by `StepTimer` to leave ``Trainer.fit`` after the steps we time."""


class StepTimer(Hook):
    """A hook (last in the list): per-step wall and CPU time between ``on_step_end`` events."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_train_start(self, run):
        self.wall, self.cpu, self._t = [], [], (time.perf_counter(), time.process_time())

    def on_step_end(self, run, m):
        w, c = time.perf_counter(), time.process_time()
        self.wall.append(w - self._t[0])
        self.cpu.append(c - self._t[1])
        self._t = (w, c)
        if len(self.wall) >= self.steps:
            raise StopBench


def bench_config(tiny: bool, precision: str = "bf16", micro_batch: int = 32, image_size: int = 96):
    """The 32K recipe with a CPU-sized model: ViT-S/16 at 96 px (37 tokens), accumulation 1, no Mixup."""
    from vitlarge.constants import IMAGENET_TRAIN_EXAMPLES

    over = {"model.name": "vit_small_patch16_224", "data.image_size": image_size}
    if tiny:
        over |= {"model.kwargs": dict(depth=2, embed_dim=64, num_heads=2), "data.image_size": 32}
        micro_batch = 4
    return recipe_config(
        "vit_b16",
        over
        | {
            "augment.mixup_alpha": 0.0,  # Mixup is the same timm call on either side; leave it out of both
            "train.precision": precision,
            "train.global_batch": micro_batch,
            "train.micro_batch": micro_batch,
            "train.eval_every_epochs": 0,
            "train.checkpoint_every_steps": 10**9,
            "data.num_train_examples": IMAGENET_TRAIN_EXAMPLES,
        },
        check="bench_train",
    )


def build_trainer(cfg, batches: list, workdir: str, timer: StepTimer):
    from hooks import build_hooks
    from vitlarge.events import RunInfo
    from vitlarge.train.loop import Trainer

    engine = build_engine(cfg)
    plan = engine.plan
    s = engine.settings  # what the engine was built for: the NaN guard and meta.json read it from here
    run_info = RunInfo(
        workdir=workdir,
        rank=0,
        is_main=True,
        device="cpu",
        start_step=0,
        plan=plan,
        cfg=cfg,
        precision=s.precision,
        compile=s.compile,
    )
    hooks = build_hooks(
        workdir, log_every=cfg.train.log_every_steps, nan_patience=cfg.train.nan_patience, console=False
    )
    return Trainer(cfg, plan, engine, OnePhase(InMemoryLoader(batches)), hooks + [timer], run_info)


class OnePhase:
    """The trainer's phase loaders for one phase of in-memory batches (no validation set)."""

    def __init__(self, train):
        self.train, self.entered = train, False

    def changes_at(self, step: int) -> bool:
        return not self.entered

    def enter(self, step: int):
        self.entered = True
        return self.train, []


def bare_steps(bare: BareLoop, steps: int) -> tuple[float, float]:
    """Per-step (wall, CPU) seconds of ``steps`` bare steps, each reading its loss as a user's loop would."""
    return timing.per_step(lambda: bare.step().item(), steps)


def run_trainer_steps(trainer, timer: StepTimer, steps: int) -> tuple[float, float]:
    timer.steps = steps
    try:
        trainer.fit()
    except StopBench:
        pass
    return sum(timer.wall) / steps, sum(timer.cpu) / steps


# ---- MFU ---------------------------------------------------------------------------------------

MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear")
CATEGORIES = [  # first match wins; op names from the profiler (aten::...)
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul")),
    ("attention (SDPA kernel)", ("scaled_dot_product", "flash_attention")),
    ("softmax", ("softmax",)),
    ("layer norm", ("layer_norm",)),
    ("gelu", ("gelu",)),
    ("casts and copies", ("aten::copy_", "aten::to", "aten::_to_copy", "aten::clone", "aten::contiguous")),
    ("optimizer and clipping", ("_fused_adam", "_foreach", "aten::norm", "linalg_vector_norm")),
    ("conv (patch embed)", ("convolution",)),
]


def train_flops(model, images, labels, dtype) -> dict:
    """FLOPs of one forward+backward (what the optimizer step adds is negligible), by op."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            logits = model(images)
        fwd = counter.get_total_flops()
        torch.nn.functional.cross_entropy(logits.float(), labels).backward()
    model.zero_grad(set_to_none=True)
    by_op = {str(k).removeprefix("aten.").split(".")[0]: v for k, v in counter.get_flop_counts()["Global"].items()}
    return {"train": counter.get_total_flops(), "forward": fwd, "by_op": by_op}


def profile_breakdown(bare: BareLoop) -> dict:
    """Self time of one bare step by op category (fractions of the step), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        bare.step()
    totals, all_us = {}, 0.0
    for ev in prof.key_averages():
        us = ev.self_cpu_time_total
        all_us += us
        cat = next((c for c, keys in CATEGORIES if any(k in ev.key for k in keys)), "other (elementwise, autograd)")
        totals[cat] = totals.get(cat, 0.0) + us
    return {
        "step_s": all_us / 1e6,
        "seconds": {k: round(v / 1e6, 4) for k, v in totals.items()},
        "fraction": {k: round(v / all_us, 3) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])},
    }


def run(quick: bool = True, tiny: bool = False) -> dict:
    tiny = results.is_tiny(tiny)
    threads = single_process(tiny)
    repeats, steps = (1, 1) if tiny else (3, 2) if quick else (5, 4)
    cfg = bench_config(tiny)
    batches = make_batches(cfg)
    workdir = tempfile.mkdtemp(prefix="vitlarge-bench-train-")
    timer = StepTimer(1)
    trainer = build_trainer(cfg, batches, workdir, timer)
    bare = BareLoop(cfg, "cpu", vitlarge_optimizer, batches)
    run_trainer_steps(trainer, timer, 1)  # warm-up: optimizer state, allocator, first-touch pages
    bare_steps(bare, 1)
    times = timing.interleaved_wall_cpu(
        {"vitlarge": lambda: run_trainer_steps(trainer, timer, steps), "bare": lambda: bare_steps(bare, steps)}, repeats
    )
    micro = cfg.train.micro_batch
    res = timing.images_per_s(times, micro, threads)
    speed = res["vitlarge"]["images_per_s"] / res["bare"]["images_per_s"]
    speed_cpu = res["vitlarge"]["images_per_s_cpu"] / res["bare"]["images_per_s_cpu"]

    # MFU of the bf16 step against this machine's bf16 (and fp32) matmul rate.
    images, labels = batches[0]
    flops = train_flops(bare.model, images, labels, torch.bfloat16)
    n = 256 if tiny else 2048 if quick else 4096
    peaks = {"bf16": [], "fp32": []}
    for _ in range(1 if tiny else 3):  # alternate so both see the same load
        peaks["bf16"].append(timing.matmul_peak(n, torch.bfloat16, 3))
        peaks["fp32"].append(timing.matmul_peak(n, torch.float32, 3))
    peak = {
        k: {
            "n": n,
            "flops_per_s": timing.median([p["flops_per_s"] for p in v]),
            "flops_per_cpu_s_x_threads": timing.median([p["flops_per_cpu_s_x_threads"] for p in v]),
        }
        for k, v in peaks.items()
    }
    step_w = res["vitlarge"]["step_s"]["median"]
    step_c = res["vitlarge"]["cpu_s_per_step"]["median"] / threads
    achieved_w, achieved_c = flops["train"] / step_w, flops["train"] / step_c
    breakdown = profile_breakdown(bare)
    matmul_flops = sum(v for k, v in flops["by_op"].items() if k in MATMUL_OPS)
    matmul_s = breakdown["seconds"].get("matmul", 0.0)
    # FlopCounterMode counts SDPA as its math (two bmm); in a ViT every bmm is attention.
    sdpa_flops = sum(v for k, v in flops["by_op"].items() if "attention" in k or k in ("bmm", "baddbmm"))
    mfu = {
        "train_flops_per_step": flops["train"],
        "three_x_forward_flops": 3 * flops["forward"],
        "flops_by_op": flops["by_op"],
        "peak": peak,
        "achieved_flops_per_s": round(achieved_w),
        "achieved_flops_per_cpu_s_x_threads": round(achieved_c),
        "mfu_vs_bf16_matmul": round(achieved_w / peak["bf16"]["flops_per_s"], 4),
        "mfu_vs_bf16_matmul_cpu": round(achieved_c / peak["bf16"]["flops_per_cpu_s_x_threads"], 4),
        "mfu_vs_fp32_matmul_cpu": round(achieved_c / peak["fp32"]["flops_per_cpu_s_x_threads"], 4),
        "profile": breakdown,
        # The FLOP/s the model's own matmuls reach in the profiled step (e.g. 1184 x 384 x 1536 at 96 px).
        "model_matmul_flops_per_s": round(matmul_flops / matmul_s) if matmul_s else None,
        "model_matmul_share_of_flops": round(matmul_flops / flops["train"], 3),
        "attention_share_of_flops": round(sdpa_flops / flops["train"], 3),
    }
    result = {
        "benchmark": "train loop: train.py (Engine + Booster DDP + Trainer) vs bare PyTorch",
        **results.describe(cfg, tiny, quick, repeats, steps, threads, precision=True),
        "results": res,
        "speed_vs_bare": round(speed, 3),
        "speed_vs_bare_cpu": round(speed_cpu, 3),
        "goal": "vitlarge >= 0.97x bare images/s; MFU >= 30% of bf16 matmul FLOP/s",
        "mfu": mfu,
    }
    results.write_result("train", result)
    return result


def show(r: dict) -> None:
    for name, v in r["results"].items():
        print(
            f"{name:9s} {v['step_s']['median']:.3f} s/step  {v['images_per_s']:.1f} img/s "
            f"({v['images_per_s_cpu']:.1f} img/s by CPU time)"
        )
    m = r["mfu"]
    print(f"vitlarge / bare: {r['speed_vs_bare']:.3f} (CPU time: {r['speed_vs_bare_cpu']:.3f})")
    print(
        f"MFU vs bf16 matmul: {100 * m['mfu_vs_bf16_matmul']:.1f}% (CPU time: {100 * m['mfu_vs_bf16_matmul_cpu']:.1f}%)"
    )
    print(json.dumps(m["profile"]["fraction"], indent=1))


if __name__ == "__main__":
    results.cli(run, __doc__, show)
