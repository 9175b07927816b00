"""Torch-facing loaders over DALI pipelines: an infinite resumable train stream, exact validation.

Contract shared by both loaders: batches are ``(images, labels)`` with images float32
``[B, 3, S, S]`` normalized by ``mean``/``std`` (0..255 scale) and labels int64 ``[B]`` in
``0..num_classes-1``, both on ``device``. Stored labels minus the manifest's ``label_offset``
give the class; a label outside the range raises UserError (checked per batch with min/max).
Everything is rank-local: each rank reads its own contiguous slice of the split's records.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math

import torch
from nvidia.dali.plugin.pytorch import feed_ndarray
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from vitlarge.data import pipelines
from vitlarge.data.manifest import MANIFEST_NAME, Manifest, check_shards, load_manifest
from vitlarge.errors import UserError

DEFAULT_MEAN = tuple(255.0 * x for x in IMAGENET_DEFAULT_MEAN)
DEFAULT_STD = tuple(255.0 * x for x in IMAGENET_DEFAULT_STD)
STATE_VERSION = 1


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise UserError(f"rank={rank}, world_size={world_size}: need 0 <= rank < world_size")


class _Batches:
    """Copies DALI outputs into fresh torch tensors on ``device`` and maps labels to classes."""

    def __init__(self, manifest: Manifest, split: str, device: torch.device, label_offset: int | None):
        self.manifest, self.split, self.device = manifest, split, device
        self.label_offset = manifest.label_offset if label_offset is None else label_offset

    def convert(self, images, labels, keep: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = images.as_tensor(), labels.as_tensor()
        out = feed_ndarray(images, torch.empty(images.shape(), dtype=torch.float32, device=self.device))
        lab = feed_ndarray(labels, torch.empty(labels.shape(), dtype=torch.int64)).view(-1)
        if keep is not None:  # strip the validation padding
            out, lab = out[:keep], lab[:keep]
        lab = lab - self.label_offset
        lo, hi = int(lab.min()), int(lab.max())
        if lo < 0 or hi >= self.manifest.num_classes:
            bad = lo if lo < 0 else hi
            d = self.manifest.data_dir
            raise UserError(
                f"{d}: stored label {bad + self.label_offset} in the {self.split} shards maps to class {bad}, "
                f"outside 0..{self.manifest.num_classes - 1} (num_classes {self.manifest.num_classes}, label offset "
                f"{self.label_offset}); fix num_classes/label_offset in {d}/{MANIFEST_NAME} or rerun "
                f"python -m data_tools.make_index {d} --label-offset N --num-classes C"
            )
        return out, lab.to(self.device, non_blocking=True)


def _run(pipe, manifest: Manifest, split: str):
    """``pipe.run()``; an image DALI cannot decode becomes a one-line UserError with the fix."""
    try:
        return pipe.run()
    except RuntimeError as e:
        text = str(e)
        if "decoders." not in text:
            raise
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "no longer valid" not in ln]
        d = manifest.data_dir
        raise UserError(
            f"{d}: an image in the {split} shards cannot be decoded ({lines[-1] if lines else 'decoder error'}); "
            "re-convert the source with python -m data_tools.imagenet_to_tfrecord --check decode --skip-bad"
        ) from None


class TrainLoader:
    """Infinite stream of augmented training batches for one rank; exactly resumable.

    ``next(loader)`` never raises StopIteration: the reader wraps over epochs (each rank keeps its
    slice of the shards, shuffled through a buffer of ``initial_fill`` records; the converter has
    already shuffled records across shards). Augmentation: random-resized crop (area
    ``crop_scale``, aspect ``crop_ratio``) decoded straight from the JPEG, resize to
    ``image_size``, horizontal flip, optional RandAugment (``"rand-m9-n2"`` or ``(n, m)``),
    normalize. ``state()`` is the DALI checkpoint after the last batch returned; a loader built
    with ``state=`` and the same arguments yields bitwise the same batches from there on.
    """

    def __init__(self, data_dir: str, batch_size: int, image_size: int, *, rank: int, world_size: int,
                 device: torch.device, seed: int, num_threads: int = 2, crop_scale=(0.08, 1.0),
                 crop_ratio=(3 / 4, 4 / 3), hflip: bool = True, randaugment=None, mean=DEFAULT_MEAN,
                 std=DEFAULT_STD, label_offset: int | None = None, state: str | None = None,
                 initial_fill: int = 4096, prefetch_queue_depth: int = 2, interpolation: str = "bilinear"):
        _check_rank(rank, world_size)
        self.manifest = load_manifest(data_dir)
        files = check_shards(self.manifest, "train")
        n = self.manifest.num_examples("train")
        begin, end = pipelines.shard_range(n, rank, world_size)
        self.num_examples_this_rank = end - begin
        if self.num_examples_this_rank < 1:
            raise UserError(f"{data_dir}: {n} training examples cannot be split over world_size={world_size}")
        self._batches = _Batches(self.manifest, "train", device, label_offset)
        dev = pipelines.dali_device(device)
        settings = dict(
            shards=[(s.file, s.bytes) for s in self.manifest.shards("train")], batch_size=batch_size,
            image_size=image_size, rank=rank, world_size=world_size, seed=seed, crop_scale=list(crop_scale),
            crop_ratio=list(crop_ratio), hflip=hflip, randaugment=pipelines.parse_randaugment(randaugment),
            mean=list(mean), std=list(std), initial_fill=initial_fill, interpolation=interpolation,
        )
        self._fingerprint = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
        checkpoint = self._decode_state(state, data_dir) if state else None
        # Distinct augmentation streams per rank; the reader seed fixes the shuffle order.
        pipe_seed = (seed * 7919 + rank) % (2**31 - 1)
        # DALI's RandAugment uses fn.experimental aliases DALI itself deprecates; DALI forces those
        # DeprecationWarnings on (its own catch_warnings), so they print once per build. Harmless.
        self._pipe = pipelines.train_pipeline(
            [f for f, _ in files], [i for _, i in files], shard_id=rank, num_shards=world_size, reader_seed=pipe_seed,
            image_size=image_size, decoder=dev.decoder, crop_scale=crop_scale, crop_ratio=crop_ratio, hflip=hflip,
            randaugment=settings["randaugment"], mean=mean, std=std, initial_fill=initial_fill,
            interp=pipelines.interp_type(interpolation),
            batch_size=batch_size, num_threads=num_threads, device_id=dev.device_id, seed=pipe_seed,
            prefetch_queue_depth=prefetch_queue_depth, enable_checkpointing=True, checkpoint=checkpoint,
        )
        self._pipe.build()

    def __iter__(self) -> "TrainLoader":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = _run(self._pipe, self.manifest, "train")
        return self._batches.convert(images, labels)

    def state(self) -> str:
        """Opaque string; pass it back as ``state=`` to continue after the last batch returned."""
        return json.dumps({
            "version": STATE_VERSION, "fingerprint": self._fingerprint,
            "dali": base64.b64encode(self._pipe.checkpoint()).decode("ascii"),
        })

    def _decode_state(self, state: str, data_dir: str) -> bytes:
        try:
            doc = json.loads(state)
            if doc["version"] != STATE_VERSION:
                raise ValueError(f"version {doc['version']}")
            blob = base64.b64decode(doc["dali"])
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"{data_dir}: TrainLoader state is not one TrainLoader.state() returned ({e}); "
                            "resume from the checkpoint's data state or start without state") from None
        if doc["fingerprint"] != self._fingerprint:
            raise UserError(
                f"{data_dir}: TrainLoader state was saved with different data or loader settings (shards, batch "
                "size, image size, rank/world size, seed or augmentation); resume with the same settings or start "
                "without state"
            )
        return blob


class ValLoader:
    """One exact pass over this rank's slice of the validation split per ``iter()``.

    Every validation record is yielded exactly once across ranks for any world size and batch
    size: DALI pads the last batch by repeating a record, and the padding is stripped here, so
    the last batch may be smaller than ``batch_size``. Iterate again for another pass; a pass
    abandoned early is drained first so the next one starts at the first record.
    """

    def __init__(self, data_dir: str, batch_size: int, image_size: int, *, rank: int, world_size: int,
                 device: torch.device, num_threads: int = 2, crop_pct: float = 0.875, mean=DEFAULT_MEAN,
                 std=DEFAULT_STD, label_offset: int | None = None, interpolation: str = "bicubic"):
        _check_rank(rank, world_size)
        if not 0 < crop_pct <= 1:
            raise UserError(f"crop_pct={crop_pct}: must be in (0, 1]")
        self.manifest = load_manifest(data_dir)
        files = check_shards(self.manifest, "validation")
        n = self.manifest.num_examples("validation")
        begin, end = pipelines.shard_range(n, rank, world_size)
        self.num_examples_this_rank = end - begin
        if self.num_examples_this_rank < 1:
            raise UserError(f"{data_dir}: {n} validation examples cannot be split over world_size={world_size}")
        self.batch_size = batch_size
        self._batches = _Batches(self.manifest, "validation", device, label_offset)
        dev = pipelines.dali_device(device)
        self._pipe = pipelines.val_pipeline(
            [f for f, _ in files], [i for _, i in files], shard_id=rank, num_shards=world_size, image_size=image_size,
            crop_pct=crop_pct, decoder=dev.decoder, mean=mean, std=std, interp=pipelines.interp_type(interpolation),
            batch_size=batch_size, num_threads=num_threads, device_id=dev.device_id, seed=0,
        )
        self._pipe.build()
        self._batches_per_pass = math.ceil(self.num_examples_this_rank / batch_size)
        self._runs_in_pass = 0  # runs of the current pass already taken from the pipeline

    def __len__(self) -> int:
        return self._batches_per_pass

    def __iter__(self):
        while 0 < self._runs_in_pass < self._batches_per_pass:  # finish an abandoned pass
            _run(self._pipe, self.manifest, "validation")
            self._runs_in_pass += 1
        self._runs_in_pass = 0
        for i in range(self._batches_per_pass):
            images, labels = _run(self._pipe, self.manifest, "validation")
            self._runs_in_pass += 1
            keep = min(self.batch_size, self.num_examples_this_rank - i * self.batch_size)
            yield self._batches.convert(images, labels, keep)
        self._runs_in_pass = 0
