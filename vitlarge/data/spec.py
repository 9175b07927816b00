"""What a loader is built from: one frozen spec per split, made once from the config and the phase.

`LoaderSpec` holds what the train and validation loaders of both sources (DALI over TFRecords,
synthetic) share; `TrainSpec` and `ValSpec` add their split's own settings and check each of them
beside the field (`__post_init__`). `vitlarge.data.sources` makes them from a config and a phase; the
loaders and the DALI pipelines take them whole. A train stream's state is tied to `TrainSpec.fingerprint`.
Importable without DALI (the synthetic source and the export need it on machines without one).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from vitlarge.config.schema import DataConfig, rule_of
from vitlarge.constants import IMAGENET_MEAN, IMAGENET_STD
from vitlarge.data.common import VAL_INTERPOLATION
from vitlarge.data.randaugment import spec as randaugment_spec
from vitlarge.errors import UserError

SRC_PADDING = 4  # DeiT III's reflect padding of the simple random crop (torchvision RandomCrop(padding=4))
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "triangular")  # `vitlarge.data.pipelines.interp_type`'s


def _check_interpolation(name: str) -> None:
    if name not in INTERPOLATIONS:
        raise UserError(f"interpolation={name!r}: expected one of {sorted(INTERPOLATIONS)}")


def knob(name: str) -> Any:  # as dataclasses.field: the field's default, whatever its type
    """A training augmentation setting that is ``data.<name>`` in the config, with that field's default and
    `Rule` (vitlarge/config/schema.py): `sources.train_spec` copies it by name, `TrainSpec` checks it with the
    rule, and its fingerprint holds it only where it is not its default (so a state saved before the knob
    existed still resumes). A new knob is its schema field, one `knob` line here and its pipeline op."""
    declared = DataConfig.__dataclass_fields__[name]
    return field(default=declared.default, metadata={"knob": name, "rule": rule_of(declared)})


def knobs() -> list[str]:
    """The `knob` fields of `TrainSpec`, in declaration order."""
    return [f.name for f in fields(TrainSpec) if "knob" in f.metadata]


def knob_values(data: DataConfig) -> dict[str, Any]:
    """The `knob` fields' values in ``data`` (the config's ``data`` section), by name: what `TrainSpec` takes."""
    return {name: getattr(data, name) for name in knobs()}


@dataclass(frozen=True)
class LoaderSpec:
    """What every loader is built from. ``mean``/``std`` in the config's 0..1 convention (the DALI loaders
    scale them to 0..255 pixels: `pixels`). ``num_classes`` and ``num_examples`` are the synthetic source's
    (a TFRecord loader reads them from ``dataset.json``); ``data_dir``, ``label_offset`` (None: the
    manifest's) and ``num_threads`` (DALI's threads) are the TFRecord source's."""

    data_dir: str
    batch_size: int
    image_size: int
    source: Literal["tfrecord", "synthetic"] = "tfrecord"
    num_classes: int = 1000
    num_examples: int = 0
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    label_offset: int | None = None
    num_threads: int = 2

    def pixels(self) -> tuple[tuple, tuple]:
        """``(mean, std)`` on DALI's 0..255 pixel scale."""
        return tuple(255.0 * v for v in self.mean), tuple(255.0 * v for v in self.std)


@dataclass(frozen=True)
class TrainSpec(LoaderSpec):
    """An infinite training stream (`vitlarge.data.loader.TrainLoader`, `vitlarge.data.synthetic.SyntheticTrain`):
    its data seed (the phase's stream seed: the same on every rank) and augmentation. Augmentation applies to
    the TFRecord source only; the synthetic one reads none of it (nor checks it)."""

    seed: int = field(kw_only=True)
    crop_scale: tuple = (0.08, 1.0)
    crop_ratio: tuple = (3 / 4, 4 / 3)
    hflip: bool = True
    randaugment: str | None = None
    initial_fill: int = 4096
    prefetch_queue_depth: int = 2
    interpolation: str = "bilinear"
    crop: str = "rrc"
    src_padding: int = SRC_PADDING
    three_augment: bool = knob("three_augment")
    color_jitter: float = knob("color_jitter")
    hw_decoder_load: float = knob("hw_decoder_load")
    rrc_decode: str = knob("rrc_decode")
    repeats: int = 1
    read_workers: int = 0

    def __post_init__(self):
        if self.source != "tfrecord":
            return
        rw, repeats, crop, pad = self.read_workers, self.repeats, self.crop, self.src_padding
        if not (isinstance(rw, int) and rw >= 0):
            raise UserError(f"read_workers={rw!r}: must be an integer >= 0 (0: read in this process)")
        if not (isinstance(repeats, int) and repeats >= 1):
            raise UserError(f"repeats={repeats!r}: must be an integer >= 1 (1: off; DeiT uses 3)")
        if crop not in ("rrc", "src"):
            raise UserError(
                f"crop={crop!r}: expected 'rrc' (random-resized crop) or 'src' (DeiT III's simple random crop)"
            )
        if crop == "src" and not (isinstance(pad, int) and 0 <= pad < self.image_size):
            raise UserError(
                f"src_padding={pad!r}: must be an integer in [0, image_size={self.image_size}) (DeiT III pads by 4)"
            )
        _check_interpolation(self.interpolation)
        if self.rrc_decode not in ("roi", "full"):
            raise UserError(f"rrc_decode={self.rrc_decode!r}: expected 'roi' (the crop's window) or 'full'")
        for f in fields(self):
            value, rule = getattr(self, f.name), f.metadata.get("rule")
            if "knob" in f.metadata and rule is not None and not rule.test(value):
                raise UserError(f"{f.name}={value}: must be {rule.words}")
            if "knob" in f.metadata and type(f.default) in (bool, float):  # 1 and 1.0 (or true) hash alike
                object.__setattr__(self, f.name, type(f.default)(value))

    def fingerprint(self, rank: int, world_size: int, shards: list[tuple[str, int]] | None = None) -> str:
        """A short hash of what a saved position of this stream means (the spec, the rank's place and, for
        the TFRecord source, the training ``shards`` as ``(file, bytes)``): a state is continued only under
        an equal one. The hashed dicts are those of the loaders that wrote the checkpoints already out there;
        a setting added later enters them only where it is not its default, so those states still resume."""
        common = dict(
            batch_size=self.batch_size,
            image_size=self.image_size,
            rank=rank,
            world_size=world_size,
            seed=self.seed,
        )
        if self.source == "synthetic":
            settings = dict(common, num_classes=self.num_classes, mean=list(self.mean), std=list(self.std))
        else:
            ra = randaugment_spec(self.randaugment)
            mean, std = self.pixels()
            settings = dict(
                common,
                shards=shards,
                crop_scale=list(self.crop_scale),
                crop_ratio=list(self.crop_ratio),
                hflip=self.hflip,
                randaugment=ra and ra.key(),
                mean=list(mean),
                std=list(std),
                initial_fill=self.initial_fill,
                interpolation=self.interpolation,
            )
            if self.crop != "rrc":
                settings["crop"] = self.crop
                if self.src_padding != SRC_PADDING:
                    settings["src_padding"] = self.src_padding
            settings.update((f.name, getattr(self, f.name)) for f in fields(self) if _knob_set(self, f))
            if self.repeats != 1:
                settings["repeats"] = self.repeats
                settings["repeats_source"] = "sample"  # positions (a state of the batch-mode source is not one)
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ValSpec(LoaderSpec):
    """An exact validation pass (`vitlarge.data.loader.ValLoader`, `vitlarge.data.synthetic.SyntheticVal`):
    timm's eval transform, the shorter side to ``image_size / crop_pct`` then a centre crop: an
    ``image_size`` square, or with ``rect_val`` each batch's own aspect ratio, its longer side rounded to
    whole ``patch_size`` patches (`vitlarge.data.rect`; the TFRecord source only)."""

    crop_pct: float = 0.875
    interpolation: str = VAL_INTERPOLATION
    rect_val: bool = False
    patch_size: int = 1

    def __post_init__(self):
        if not 0 < self.crop_pct <= 1:
            raise UserError(f"crop_pct={self.crop_pct}: must be in (0, 1]")
        if not (isinstance(self.patch_size, int) and self.patch_size >= 1):
            raise UserError(f"patch_size={self.patch_size!r}: must be an integer >= 1")
        _check_interpolation(self.interpolation)


def _knob_set(spec: TrainSpec, f) -> bool:
    return "knob" in f.metadata and getattr(spec, f.name) != f.default


def pipe_seed(seed: int, rank: int) -> int:
    """A rank's DALI seed (shuffle buffer and augmentation): distinct per rank, derived from the stream's."""
    return (seed * 7919 + rank) % (2**31 - 1)
