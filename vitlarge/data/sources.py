"""Builds the loaders a config asks for; the one place config fields map to loader arguments.

``data.source`` picks the batch source: ``tfrecord`` (DALI over the shards in ``data.path``) or
``synthetic`` (`vitlarge.data.synthetic`: random batches made on the device). Both give the same
contract (`vitlarge.data.loader`), so nothing after these functions knows which one runs. DALI is
imported only for ``tfrecord``.
"""

from __future__ import annotations

import os

import torch

from vitlarge.config.schema import Config
from vitlarge.data import synthetic
from vitlarge.data.manifest import Manifest, check_shards, load_manifest
from vitlarge.errors import UserError


def check_data(cfg: Config) -> Manifest:
    """The manifest of ``cfg.data.path`` after the checks that need no pipeline: its class count matches
    ``data.num_classes``, ``data.randaugment`` parses and every shard of both splits is there, whole, with its
    index (`check_shards`: a stat and an 8-byte read each). Fails before any work or file is written.
    For ``data.source=synthetic``: a manifest with ``data.num_classes`` synthetic classes and
    ``data.num_train_examples`` training examples; no file is read."""
    if cfg.data.source == "synthetic":
        return synthetic.manifest(cfg.data.num_classes, cfg.data.num_train_examples, cfg.data.synthetic_val_examples)
    from vitlarge.data.randaugment import spec as randaugment_spec

    manifest = load_manifest(cfg.data.path)
    if manifest.num_classes != cfg.data.num_classes:
        raise UserError(
            f"{cfg.data.path}/dataset.json has {manifest.num_classes} classes but data.num_classes="
            f"{cfg.data.num_classes}; set data.num_classes={manifest.num_classes}"
        )
    randaugment_spec(cfg.data.randaugment)
    for split in ("train", "validation"):  # here, inside the agreed pre-flight: a shard missing on one node
        check_shards(manifest, split)  # stops every rank, printed by the rank that met it (not at the first step)
    return manifest


def _pixels(values) -> tuple:
    return tuple(255.0 * v for v in values)  # the config keeps timm's 0..1 convention; DALI sees 0..255


def num_threads(cfg: Config) -> int:
    """DALI threads: the recipe's ``data.num_threads``, or with 0 this process's CPU share from its launcher
    (``vitlarge.distributed.threads.dali_threads``: affinity mask, Slurm binding, tasks on the node; not torchrun's
    blanket ``OMP_NUM_THREADS=1``)."""
    if cfg.data.num_threads:
        return cfg.data.num_threads
    from vitlarge.distributed.threads import dali_threads

    return dali_threads(os.environ, len(os.sched_getaffinity(0)))[0]


def _check_state_source(cfg: Config, state: str | None) -> None:
    """A checkpoint's data state continues only the source that wrote it (a synthetic position means
    nothing to DALI, and weights trained on noise are not a start for real data, nor the reverse)."""
    if not state:
        return
    written = "synthetic" if synthetic.is_state(state) else "tfrecord"
    if written != cfg.data.source:
        raise UserError(
            f"the checkpoint being resumed was trained with data.source={written}, this run has "
            f"data.source={cfg.data.source}; resume with data.source={written}, or pass another --workdir"
        )


def train_loader(cfg: Config, rank: int, world_size: int, device: torch.device, state: str | None = None):
    """The infinite, resumable train stream of this rank (`TrainLoader` or `SyntheticTrain`)."""
    _check_state_source(cfg, state)
    d = cfg.data
    if d.source == "synthetic":
        return synthetic.SyntheticTrain(
            cfg.train.micro_batch,
            d.image_size,
            d.num_classes,
            rank=rank,
            world_size=world_size,
            device=device,
            seed=cfg.train.seed,
            num_examples=d.num_train_examples,
            mean=d.mean,
            std=d.std,
            state=state,
        )
    from vitlarge.data.loader import TrainLoader

    return TrainLoader(
        d.path,
        cfg.train.micro_batch,
        d.image_size,
        rank=rank,
        world_size=world_size,
        device=device,
        seed=cfg.train.seed,
        num_threads=num_threads(cfg),
        crop_scale=tuple(d.crop_scale),
        crop_ratio=tuple(d.crop_ratio),
        hflip=d.hflip,
        randaugment=d.randaugment,
        mean=_pixels(d.mean),
        std=_pixels(d.std),
        label_offset=d.label_offset,
        state=state,
        crop=d.crop,
        src_padding=d.src_padding,
        three_augment=d.three_augment,
        color_jitter=d.color_jitter,
        repeats=d.repeats,
        read_workers=d.read_workers,
        interpolation=d.train_interpolation,
    )


def val_loader(cfg: Config, rank: int, world_size: int, device: torch.device):
    """One exact validation pass per ``iter()`` over this rank's slice (`ValLoader` or `SyntheticVal`)."""
    d = cfg.data
    if d.source == "synthetic":
        return synthetic.SyntheticVal(
            cfg.train.micro_batch,
            d.image_size,
            d.num_classes,
            rank=rank,
            world_size=world_size,
            device=device,
            num_examples=d.synthetic_val_examples,
            mean=d.mean,
            std=d.std,
        )
    from vitlarge.data.loader import ValLoader

    return ValLoader(
        d.path,
        cfg.train.micro_batch,
        d.image_size,
        rank=rank,
        world_size=world_size,
        device=device,
        num_threads=num_threads(cfg),
        crop_pct=d.val_crop_pct,
        mean=_pixels(d.mean),
        std=_pixels(d.std),
        label_offset=d.label_offset,
    )
