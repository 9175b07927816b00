"""What ``--dry-run --gpu KIND`` adds to the training steps' time (`vitlarge.run.gpu_hours`): the input pipeline a
GPU needs at its training rate (CPU cores decoding, storage bytes/s), the validation passes of the recipe's
schedule and its checkpoints. Each figure says whether it is measured, scaled from a measurement, or assumed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vitlarge.config.schema import Config
from vitlarge.constants import IMAGENET_TRAIN_BYTES, IMAGENET_TRAIN_EXAMPLES, IMAGENET_VAL_EXAMPLES
from vitlarge.plan.plan import Plan
from vitlarge.text import plural

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


@dataclass(frozen=True)
class DataFigures:
    """What the dry run knows of the data set: mean stored bytes of a training record (0: nothing is read; None:
    unknown), validation images (None: unknown), and where they come from."""

    bytes_per_image: float | None
    val_images: int | None
    source: str


def data_figures(cfg: Config, plan: Plan, manifest: Manifest | None) -> DataFigures:
    """The data set's dataset.json where it is here (measured), else ImageNet-1K's figures where the plan is for
    ImageNet's training count (stated), else unknown: never another data set's numbers."""
    if cfg.data.source == "synthetic":
        return DataFigures(0.0, cfg.data.synthetic_val_examples, "data.source=synthetic: made on the GPU")
    if manifest is not None:
        shards = manifest.shards("train")
        size = sum(s.bytes for s in shards) / max(1, sum(s.num_records for s in shards))
        val = manifest.num_examples("validation") if manifest.splits.get("validation") else 0
        return DataFigures(size, val, f"measured: {size / 1e3:,.1f} kB a record in dataset.json's training shards")
    if plan.num_train_examples == IMAGENET_TRAIN_EXAMPLES:
        size = IMAGENET_TRAIN_BYTES / IMAGENET_TRAIN_EXAMPLES
        return DataFigures(
            size,
            IMAGENET_VAL_EXAMPLES,
            f"stated: {size / 1e3:,.1f} kB an image, ImageNet-1K's {IMAGENET_TRAIN_BYTES / 1e9:.1f} GB of training JPEGs",
        )
    return DataFigures(None, None, "no dataset.json here (--data) and not ImageNet's count: unknown")


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


def pipeline_lines(images_per_s: float, world_size: int, data: DataFigures, hw_decoder_load: float) -> list[str]:
    """What the input pipeline must deliver for one GPU training at ``images_per_s``: CPU cores and storage."""
    if data.bytes_per_image == 0:
        return [f"  input pipeline: none ({data.source}: nothing read or decoded)"]
    if data.bytes_per_image is None:
        storage = f"storage bytes/s {data.source}"
    else:
        per_gpu = images_per_s * data.bytes_per_image
        storage = (
            f"storage {per_gpu / 1e9:.2f} GB/s per GPU, {per_gpu * world_size / 1e9:.1f} GB/s for "
            f"{plural(world_size, 'GPU')} ({data.source})"
        )
    return [
        f"  input pipeline per GPU at {images_per_s:,.1f} img/s: {images_per_s / DECODE_IMAGES_PER_CORE:,.1f} CPU "
        f"cores decoding on the CPU (measured: {DECODE_IMAGES_PER_CORE:g} img/s per core, {DECODE_SOURCE}); {storage}",
        f"    a GPU run decodes with DALI's mixed decoder, data.hw_decoder_load {hw_decoder_load:g} of the JPEGs on "
        "the GPU's hardware JPEG decoder: fewer CPU cores than this, how many not yet measured",
    ]


def run_costs(cfg: Config, plan: Plan, rates: list[PhaseRate], params: int, val_images: int | None) -> Costs:
    """Evaluation and checkpoint time of ``plan`` on ``plan.world_size`` GPUs (``rates``: one per phase, in
    order): the validation passes of the schedule (every ``plan.eval_every_steps`` and at the end, twice with an
    EMA), each at the phase it follows, and the checkpoints (every ``train.checkpoint_every_steps`` and at the
    end), each the whole checkpoint at `CHECKPOINT_WRITE_BPS`. ``val_images`` None (unknown): passes not
    counted, and said so."""
    every = plan.eval_every_steps
    at = [*range(every, plan.total_steps, every), plan.total_steps] if every else [plan.total_steps]
    copies = 2 if cfg.train.ema_decay > 0 else 1  # the EMA's weights are validated beside the raw ones
    speeds = [rates[plan.phase_at(s - 1).index].eval_images_per_s for s in at]  # the phase each pass follows
    eval_s = sum(copies * (val_images or 0) / (plan.world_size * v) for v in speeds)
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
            f"(scaled: forward only, {rates[0].forwards}x the training rate by FLOPs; not measured) = {span(eval_s)}"
            if val_images is not None
            else f"  evaluation: {len(at)} passes{ema}, not counted: validation images unknown without dataset.json",
            f"  checkpoints: {saves} x {size / 1e9:.2f} GB (fp32 weights and 2 optimizer moments"
            f"{', EMA' if copies == 2 else ''}) at {CHECKPOINT_WRITE_BPS / 1e9:g} GB/s (assumed: one NVMe drive or "
            f"parallel file system client; not measured) = {span(checkpoint_s)}",
        ),
    )
