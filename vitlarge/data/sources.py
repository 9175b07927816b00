"""Builds the loaders a config asks for; the one place config fields map to loader specs (`vitlarge.data.spec`).

``data.source`` picks the batch source: ``tfrecord`` (DALI over the shards in ``data.path``) or
``synthetic`` (`vitlarge.data.synthetic`: random batches made on the device). Both give the same
contract (`vitlarge.data.loader`), so nothing after these functions knows which one runs. DALI is
imported only for ``tfrecord``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from vitlarge.config.phase_list import patch_size, rect_val_anywhere
from vitlarge.config.schema import Config
from vitlarge.data import synthetic
from vitlarge.data.manifest import Manifest, load_manifest, shard_files
from vitlarge.data.randaugment import spec as randaugment_spec
from vitlarge.data.rect import val_sizes, val_sizes_listed
from vitlarge.data.spec import TrainSpec, ValSpec, knob_values
from vitlarge.distributed.threads import dali_threads
from vitlarge.errors import UserError
from vitlarge.plan.phases import Phase
from vitlarge.plan.plan import stream_seed

if TYPE_CHECKING:
    from vitlarge.data.loader import TrainLoader, ValLoader


def checked_manifest(cfg: Config) -> Manifest:
    """The manifest of ``cfg.data.path`` after the checks that need no pipeline: its class count matches
    ``data.num_classes``, ``data.randaugment`` parses, every shard of both splits is there, whole, with its
    index (`shard_files`: a stat and an 8-byte read each), and where a phase validates rectangular batches
    the validation split has its images' sizes in aspect order (`vitlarge.data.rect.val_sizes`). Fails
    before any work or file is written.
    For ``data.source=synthetic``: a manifest with ``data.num_classes`` synthetic classes and
    ``data.num_train_examples`` training examples; no file is read."""
    if cfg.data.source == "synthetic":
        return synthetic.manifest(cfg.data.num_classes, cfg.data.num_train_examples, cfg.data.synthetic_val_examples)
    manifest = load_manifest(cfg.data.path)
    check_classes(cfg, manifest)
    randaugment_spec(cfg.data.randaugment)
    for split in ("train", "validation"):  # here, inside the agreed pre-flight: a shard missing on one node
        shard_files(manifest, split)  # stops every rank, printed by the rank that met it (not at the first step)
    if rect_val_anywhere(cfg):
        val_sizes(manifest)
    return manifest


def check_classes(cfg: Config, manifest: Manifest) -> None:
    """A one-line `UserError` unless ``data.num_classes`` is the data set's class count."""
    if manifest.num_classes != cfg.data.num_classes:
        raise UserError(
            f"{cfg.data.path}/dataset.json has {manifest.num_classes} classes but data.num_classes="
            f"{cfg.data.num_classes}; set data.num_classes={manifest.num_classes}"
        )


def planning_manifest(cfg: Config) -> Manifest | None:
    """What ``--dry-run`` plans from: ``data.path``'s dataset.json where that folder exists, read and checked as a
    run checks it (the manifest, its class count against ``data.num_classes``; a `UserError` otherwise), so the
    plan's steps are the run's; None where there is no folder (a plan made before the data is there, or for
    another machine: the recipe's ``data.num_train_examples``) or the source is synthetic. Reads dataset.json
    alone: no shard and no ``.sizes`` file (where a phase validates rectangular batches it checks that dataset.json
    records the sizes, `val_sizes_listed`; the run's pre-flight, `checked_manifest`, reads them), so a login node
    holding a copy of dataset.json without the shards and sizes files plans as the run will."""
    if cfg.data.source == "synthetic" or not cfg.data.path or not os.path.isdir(cfg.data.path):
        return None
    manifest = load_manifest(cfg.data.path)
    check_classes(cfg, manifest)
    if rect_val_anywhere(cfg):  # what dataset.json says of the sizes; their files are the run's to read
        val_sizes_listed(manifest)
    return manifest


def num_threads(cfg: Config) -> int:
    """DALI threads: the recipe's ``data.num_threads``, or with 0 this process's CPU share from its launcher
    (``vitlarge.distributed.threads.dali_threads``: affinity mask, Slurm binding, tasks on the node; not torchrun's
    blanket ``OMP_NUM_THREADS=1``)."""
    if cfg.data.num_threads:
        return cfg.data.num_threads
    return dali_threads(os.environ, len(os.sched_getaffinity(0)))[0]


def source_changed(written: str, cfg: Config) -> str | None:
    """The line refusing a resume under another ``data.source`` than ``written``, the checkpoint's; None where
    they agree. A checkpoint continues only the source that wrote it (a synthetic position means nothing to DALI,
    and weights trained on noise are not a start for real data, nor the reverse)."""
    if written == cfg.data.source:
        return None
    return (
        f"the checkpoint being resumed was trained with data.source={written}, this run has "
        f"data.source={cfg.data.source}; resume with data.source={written}, or pass another --workdir"
    )


def _check_state_source(cfg: Config, state: str | None) -> None:
    """`source_changed` for a checkpoint's data state (the source that wrote it, read from the state itself)."""
    if not state:
        return
    why = source_changed("synthetic" if synthetic.is_state(state) else "tfrecord", cfg)
    if why:
        raise UserError(why)


def _common(cfg: Config, batch_size: int, image_size: int, num_examples: int) -> dict:
    """The `LoaderSpec` fields both splits take from the config."""
    d = cfg.data
    return dict(
        data_dir=d.path,
        batch_size=batch_size,
        image_size=image_size,
        source=d.source,
        num_classes=d.num_classes,
        num_examples=num_examples,
        mean=tuple(d.mean),
        std=tuple(d.std),
        label_offset=d.label_offset,
        num_threads=num_threads(cfg) if d.source == "tfrecord" else 0,  # DALI's; the synthetic source has none
    )


def train_spec(cfg: Config, phase: Phase | None = None, fresh_at: int | None = None) -> TrainSpec:
    """What the train stream of ``phase`` is built from: its micro batch, image size, crop scale and stream
    seed (`vitlarge.plan.plan.stream_seed`; ``fresh_at``: the step a stream with no position to continue
    starts at), the rest from ``cfg``. No phase: the config's own values and seed (tests, tools)."""
    d = cfg.data
    if phase is None:
        batch, size, crop_scale = cfg.train.micro_batch, d.image_size, d.crop_scale
    else:
        batch, size, crop_scale = phase.micro_batch, phase.image_size, phase.crop_scale
    common = _common(cfg, batch, size, d.num_train_examples)
    seed = cfg.train.seed if phase is None else stream_seed(cfg.train.seed, phase.index, fresh_at)
    return TrainSpec(
        **common,
        seed=seed,
        crop_scale=tuple(crop_scale),
        crop_ratio=tuple(d.crop_ratio),
        hflip=d.hflip,
        randaugment=d.randaugment,
        interpolation=d.train_interpolation,
        crop=d.crop,
        src_padding=d.src_padding,
        repeats=d.repeats,
        read_workers=d.read_workers,
        **knob_values(d),  # augmentation knobs: the same names as data.<name>
    )


def val_spec(cfg: Config, phase: Phase | None = None, image_size: int | None = None) -> ValSpec:
    """What the validation loader of ``phase`` is built from: its micro batch at its ``eval_size``, square or
    rectangular (its ``rect_val``); the trainer's evaluation and ``python -m vitlarge.evaluate`` both use it, so
    they agree to the image. No phase: the config's micro batch at ``image_size`` (default ``data.image_size``)
    and ``data.rect_val``."""
    if phase is None:
        batch, size, rect = cfg.train.micro_batch, image_size or cfg.data.image_size, cfg.data.rect_val
    else:
        batch, size, rect = phase.micro_batch, phase.eval_size, phase.rect_val
    return ValSpec(
        **_common(cfg, batch, size, cfg.data.synthetic_val_examples),
        crop_pct=cfg.data.val_crop_pct,
        rect_val=rect,
        patch_size=patch_size(cfg),
    )


def train_loader(
    cfg: Config,
    rank: int,
    world_size: int,
    device: torch.device,
    state: str | None = None,
    *,
    phase: Phase | None = None,
    fresh_at: int | None = None,
) -> TrainLoader | synthetic.SyntheticTrain:
    """The infinite, resumable train stream of this rank (`TrainLoader` or `SyntheticTrain`) for ``phase``
    (`train_spec`)."""
    _check_state_source(cfg, state)
    spec = train_spec(cfg, phase, fresh_at)
    if spec.source == "synthetic":
        return synthetic.SyntheticTrain(spec, rank=rank, world_size=world_size, device=device, state=state)
    from vitlarge.data.loader import TrainLoader  # lazy: keeps DALI off the synthetic source's start-up path

    return TrainLoader(spec, rank=rank, world_size=world_size, device=device, state=state)


def val_loader(
    cfg: Config,
    rank: int,
    world_size: int,
    device: torch.device,
    *,
    phase: Phase | None = None,
    image_size: int | None = None,
) -> ValLoader | synthetic.SyntheticVal:
    """One exact validation pass per ``iter()`` over this rank's slice (`ValLoader` or `SyntheticVal`) for
    ``phase`` (`val_spec`)."""
    spec = val_spec(cfg, phase, image_size)
    if spec.source == "synthetic":
        return synthetic.SyntheticVal(spec, rank=rank, world_size=world_size, device=device)
    from vitlarge.data.loader import ValLoader  # lazy: keeps DALI off the synthetic source's start-up path

    return ValLoader(spec, rank=rank, world_size=world_size, device=device)
