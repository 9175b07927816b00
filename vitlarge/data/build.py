"""Builds the DALI loaders a config asks for; the one place config fields map to loader arguments."""

from __future__ import annotations

import os

import torch

from vitlarge.config import Config
from vitlarge.data.loader import TrainLoader, ValLoader
from vitlarge.data.manifest import Manifest, load_manifest
from vitlarge.data.randaugment import spec as randaugment_spec
from vitlarge.errors import UserError


def check_data(cfg: Config) -> Manifest:
    """The manifest of ``cfg.data.path`` after the checks that need no pipeline: its class count matches
    ``data.num_classes`` and ``data.randaugment`` parses. Fails before any work or file is written."""
    manifest = load_manifest(cfg.data.path)
    if manifest.num_classes != cfg.data.num_classes:
        raise UserError(
            f"{cfg.data.path}/dataset.json has {manifest.num_classes} classes but data.num_classes="
            f"{cfg.data.num_classes}; set data.num_classes={manifest.num_classes}"
        )
    randaugment_spec(cfg.data.randaugment)
    return manifest


def _pixels(values) -> tuple:
    return tuple(255.0 * v for v in values)  # the config keeps timm's 0..1 convention; DALI sees 0..255


def num_threads(cfg: Config) -> int:
    """DALI threads: the recipe's ``data.num_threads``, or with 0 this process's CPU share from its launcher
    (``vitlarge.launch.dali_threads``: affinity mask, Slurm binding, tasks on the node; not torchrun's
    blanket ``OMP_NUM_THREADS=1``)."""
    if cfg.data.num_threads:
        return cfg.data.num_threads
    from vitlarge.launch import dali_threads

    return dali_threads(os.environ, len(os.sched_getaffinity(0)))[0]


def train_loader(cfg: Config, rank: int, world_size: int, device: torch.device, state: str | None = None) -> TrainLoader:
    d = cfg.data
    return TrainLoader(
        d.path, cfg.train.micro_batch, d.image_size, rank=rank, world_size=world_size, device=device,
        seed=cfg.train.seed, num_threads=num_threads(cfg), crop_scale=tuple(d.crop_scale),
        crop_ratio=tuple(d.crop_ratio), hflip=d.hflip, randaugment=d.randaugment, mean=_pixels(d.mean),
        std=_pixels(d.std), label_offset=d.label_offset, state=state,
    )


def val_loader(cfg: Config, rank: int, world_size: int, device: torch.device) -> ValLoader:
    d = cfg.data
    return ValLoader(
        d.path, cfg.train.micro_batch, d.image_size, rank=rank, world_size=world_size, device=device,
        num_threads=num_threads(cfg), crop_pct=d.val_crop_pct, mean=_pixels(d.mean), std=_pixels(d.std),
        label_offset=d.label_offset,
    )
