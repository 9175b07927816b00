"""What ``--dry-run --gpu KIND`` adds to the training steps' time (`vitlarge.run.gpu_hours`): the input pipeline a
GPU needs at its training rate (CPU cores decoding, storage bytes/s), the validation passes of the recipe's
schedule and its checkpoints. Each figure says whether it is measured, scaled from a measurement, or assumed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vitlarge.config.schema import Config
from vitlarge.constants import IMAGENET_TRAIN_BYTES, IMAGENET_TRAIN_EXAMPLES
from vitlarge.plan.plan import Plan

if TYPE_CHECKING:  # numpy, which the manifest module imports, stays off train.py --help
    from vitlarge.data.manifest import Manifest

DECODE_IMAGES_PER_CORE = 383.2
"""Images per CPU-second of the training loader, DALI on the CPU at 224 px (decode, random-resized crop, flip,
normalise): measured by ``benchmarks/bench_data.py`` (``dali_trainloader`` in benchmarks/results/data.json's
``images_per_cpu_s_median``, docs/PERFORMANCE.md section 1) on a 2-core Intel Xeon; server cores are faster."""
DECODE_SOURCE = "benchmarks/bench_data.py on a 2-core Intel Xeon"
CHECKPOINT_WRITE_BPS = 1e9
"""Bytes/s a checkpoint is written at: assumed (one NVMe drive or one parallel file system client sustains
1-3 GB/s), not measured on a cluster; under fsdp each rank writes its shard, so this bounds it from above."""
CHECKPOINT_BYTES_PER_PARAM = 4 + 8
"""fp32 weights and the optimizer's two fp32 moments (LAMB's and AdamW's), per parameter; the EMA adds 4."""


def span(seconds: float) -> str:
    """A duration in hours, or in minutes below 0.1 h (where hours would print as 0.00)."""
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.1f} min"


def passes(total_steps: int, every: int) -> int:
    """Times the loop acts every ``every`` steps before its last step (`vitlarge.train.loop`), plus the one at
    the end it always does (the final evaluation, the last checkpoint); ``every`` 0: only that one."""
    return (total_steps - 1) // every + 1 if every else 1


def bytes_per_image(manifest: Manifest | None) -> tuple[float, str]:
    """Mean stored bytes of a training record, and where it comes from: the data set's dataset.json where it is
    here (measured), else ImageNet-1K's JPEGs (stated)."""
    if manifest is not None:
        shards = manifest.shards("train")
        n = sum(s.num_records for s in shards)
        if n:
            size = sum(s.bytes for s in shards) / n
            return size, f"measured: {size / 1e3:,.1f} kB a record in dataset.json's training shards"
    size = IMAGENET_TRAIN_BYTES / IMAGENET_TRAIN_EXAMPLES
    return size, (
        f"stated: {size / 1e3:,.1f} kB an image, ImageNet-1K's {IMAGENET_TRAIN_BYTES / 1e9:.1f} GB of training JPEGs"
    )


def forwards_per_step(recompute: str) -> int:
    """A training image's FLOPs in forwards: the forward and a backward of about two, and under full activation
    checkpointing (``train.activation_checkpointing=full``) the forward again (``selective`` recomputes little)."""
    return 4 if recompute == "full" else 3


@dataclass(frozen=True)
class PhaseRate:
    """One phase's training images/s per GPU, its forward FLOPs per image at its training and evaluation size, and
    a training image's cost in forwards (`forwards_per_step`)."""

    images_per_s: float
    train_fwd_flops: float
    eval_fwd_flops: float
    forwards: int

    @property
    def eval_images_per_s(self) -> float:
        """Scaled, not measured: a validation image costs its forward only, at the evaluation size."""
        return self.images_per_s * self.forwards * self.train_fwd_flops / self.eval_fwd_flops


@dataclass(frozen=True)
class Costs:
    """Seconds of a run beside its training steps, and the lines that say how they were reached."""

    eval_s: float
    checkpoint_s: float
    lines: tuple[str, ...]


def pipeline_lines(
    images_per_s: float, world_size: int, manifest: Manifest | None, hw_decoder_load: float
) -> list[str]:
    """What the input pipeline must deliver for one GPU training at ``images_per_s``: CPU cores and storage."""
    size, source = bytes_per_image(manifest)
    per_gpu = images_per_s * size
    return [
        f"  input pipeline per GPU at {images_per_s:,.1f} img/s: {images_per_s / DECODE_IMAGES_PER_CORE:.1f} CPU "
        f"cores decoding on the CPU (measured: {DECODE_IMAGES_PER_CORE:g} img/s per core, {DECODE_SOURCE}); storage "
        f"{per_gpu / 1e9:.2f} GB/s per GPU, {per_gpu * world_size / 1e9:.1f} GB/s for {world_size} GPUs ({source})",
        f"    a GPU run decodes with DALI's mixed decoder, data.hw_decoder_load {hw_decoder_load:g} of the JPEGs on "
        "the GPU's hardware JPEG decoder: fewer CPU cores than this, how many not yet measured",
    ]


def run_costs(cfg: Config, plan: Plan, rates: list[PhaseRate], params: int, val_images: int) -> Costs:
    """Evaluation and checkpoint time of ``plan`` on ``plan.world_size`` GPUs (``rates``: one per phase, in
    order): the validation passes of the schedule (every ``plan.eval_every_steps`` and at the end, twice with an
    EMA), each at the phase it follows, and the checkpoints (every ``train.checkpoint_every_steps`` and at the
    end), each the whole checkpoint at `CHECKPOINT_WRITE_BPS`."""
    every = plan.eval_every_steps
    at = [*range(every, plan.total_steps, every), plan.total_steps] if every else [plan.total_steps]
    copies = 2 if cfg.train.ema_decay > 0 else 1  # the EMA's weights are validated beside the raw ones
    speeds = [rates[plan.phase_at(s - 1).index].eval_images_per_s for s in at]  # the phase each pass follows
    eval_s = sum(copies * val_images / (plan.world_size * v) for v in speeds)
    lo, hi = min(speeds), max(speeds)
    speed = f"{lo:,.0f}" if round(lo) == round(hi) else f"{lo:,.0f} to {hi:,.0f}"
    saves = passes(plan.total_steps, cfg.train.checkpoint_every_steps)
    size = params * (CHECKPOINT_BYTES_PER_PARAM + (4 if cfg.train.ema_decay > 0 else 0))
    checkpoint_s = saves * size / CHECKPOINT_WRITE_BPS
    ema = " (and the EMA's)" if copies == 2 else ""
    return Costs(
        eval_s,
        checkpoint_s,
        (
            f"  evaluation: {len(at)} passes{ema} x {val_images:,} validation images at {speed} img/s per GPU "
            f"(scaled: forward only, {rates[0].forwards}x the training rate by FLOPs; not measured) = {span(eval_s)}",
            f"  checkpoints: {saves} x {size / 1e9:.2f} GB (fp32 weights and 2 optimizer moments"
            f"{', EMA' if copies == 2 else ''}) at {CHECKPOINT_WRITE_BPS / 1e9:g} GB/s (assumed: one NVMe drive or "
            f"parallel file system client; not measured) = {span(checkpoint_s)}",
        ),
    )
