"""Rectangular validation (``data.rect_val``): fast.ai/DIUx imagenet18's ``rect_val`` for a ViT.

The validation split is stored sorted by aspect ratio (width / height) (``"order": "aspect"`` in
``dataset.json``), each image's size in its shard's ``.sizes`` file (the converter writes them so,
`vitlarge.data.manifest`); a split stored in another order whose sizes are recorded (TFDS's, read in place:
`data_tools.make_index` reads them from the JPEG headers) is read in that order by index, the same chunks. It is cut
into chunks of ``batch_size`` consecutive records in that order, and chunk ``c`` is batch ``c // world_size``
of rank ``c % world_size`` (fast.ai's ``DistValSampler`` and ``map_idx2ar``): a batch is a chunk at any world
size, so every image is cropped alike and a pass gives the same numbers at any world size, as the square
crop's does. A chunk's images are resized as the square crop resizes them (shorter side to
``int(image_size / crop_pct)``) and centre-cropped to the chunk's mean aspect ratio: the shorter side
``image_size``, the longer ``image_size x aspect`` rounded to whole patches, so the model sees a
rectangular token grid (timm's ``dynamic_img_size`` resamples the position embedding to it). An image
whose own aspect is far from its chunk's (more than ``1 / crop_pct``) is scaled up until it covers the
crop, never padded. Square images in square chunks get exactly the square crop's pixels.

Counting: ``ceil(n / batch)`` chunks dealt round robin give each rank ``ceil(n / (batch x world))`` batches,
`val_forwards` (the square loader's count, the same on every rank: a sharded model's forwards are
collective). The last chunk is padded with its last record and a rank past the last chunk forwards a
padding-only batch; every rank's batches are full, full, ..., partial, padding-only, so `ValLoader` keeps
its first ``num_examples_this_rank - i x batch`` rows of batch ``i`` as for the square crop. Nothing here
imports DALI; `vitlarge.data.pipelines.val_pipeline` takes `RectBatches` as its source.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from vitlarge.data.common import val_forwards
from vitlarge.data.manifest import MANIFEST_NAME, Manifest, convert_cmd, split_sizes
from vitlarge.data.manifest_schema import TF_SLIM_FEATURES
from vitlarge.errors import UserError

if TYPE_CHECKING:
    from nvidia.dali.types import BatchInfo

Size = tuple[int, int]  # (height, width) in pixels, as stored


MAX_ASPECT = 4.0
"""A chunk's crop is at most 4:1 (or 1:4): a panorama alone in the last chunk, or a record that declares a
1 x 1,048,576 image, would otherwise multiply that batch's tokens without bound (a batch of 256 at 224 x 917,808).
An image beyond it is cropped to 4:1 around its centre, as the square crop crops any image."""


def crop_shape(aspect: float, image_size: int, patch: int) -> Size:
    """``(height, width)`` of the crop for a mean aspect ratio ``aspect`` (width / height), held within
    `MAX_ASPECT`: the shorter side ``image_size``, the longer ``image_size x aspect`` (or ``/ aspect``) to the
    nearest whole patch, at least ``image_size``."""
    aspect = min(max(aspect, 1 / MAX_ASPECT), MAX_ASPECT)
    long = image_size * (aspect if aspect >= 1 else 1 / aspect)
    side = max(image_size, math.floor(long / patch + 0.5) * patch)
    return (image_size, side) if aspect >= 1 else (side, image_size)


def chunk_shapes(sizes: np.ndarray | list[Size], batch_size: int, image_size: int, patch: int) -> list[Size]:
    """The crop of each chunk of ``batch_size`` consecutive ``sizes`` (``(height, width)`` rows: `val_sizes`'
    array, or a list of pairs): its images' mean width / height."""
    sides = np.asarray(sizes).reshape(-1, 2)
    aspects = sides[:, 1].astype(np.float64) / sides[:, 0]  # w / h of each image, rounded as Python's: the same means
    return [
        crop_shape(float(np.mean(aspects[c : c + batch_size])), image_size, patch)
        for c in range(0, len(aspects), batch_size)
    ]


def rank_chunks(num_examples: int, rank: int, world_size: int, batch_size: int) -> list[int | None]:
    """The chunk each batch of rank ``rank``'s pass holds, in order; None for a padding-only batch."""
    chunks = math.ceil(num_examples / batch_size)
    runs = val_forwards(num_examples, world_size, batch_size)
    return [c if (c := i * world_size + rank) < chunks else None for i in range(runs)]


def val_sizes_listed(manifest: Manifest) -> None:
    """What ``dataset.json`` alone says of the validation split's sizes, no file read: a one-line UserError with the
    fix where the split's sizes are not recorded (converted before vitlarge recorded them, or indexed by
    ``make_index`` from TF-slim shards made elsewhere without ``image/height``); a split in another order than by
    aspect ratio is read in that order (`RectBatches`). The dry run's check (it plans where
    the ``.sizes`` files may not be, a login node's copy of dataset.json); `val_sizes` reads them."""
    listed = all(s.sizes is not None or s.sizes_file is not None for s in manifest.shards("validation"))
    if not listed:
        d = manifest.data_dir
        raise UserError(
            f"{d}/{MANIFEST_NAME}: the validation split is not stored sorted by aspect ratio with its image sizes, "
            f"which data.rect_val needs; convert it again with {convert_cmd()} --src ROOT --out {d} and the "
            "arguments it was made with (the training shards are kept, only the validation shards are rewritten), "
            "or set data.rect_val=false"
        )


def val_sizes(manifest: Manifest) -> np.ndarray:
    """The validation split's image sizes in record order (`split_sizes`' ``(n, 2)`` uint32 array, read once per
    process, its files checked); `val_sizes_listed`'s UserError where dataset.json records none."""
    val_sizes_listed(manifest)
    sizes = split_sizes(manifest, "validation")
    assert sizes is not None  # every shard lists its sizes (val_sizes_listed)
    return sizes


class RectBatches:
    """DALI batch source of one rank's rectangular validation pass: batch ``i`` (``BatchInfo.iteration``, taken
    modulo the pass's `runs`) is ``(encoded JPEGs, labels [B, 1] int64, crop heights [B], crop widths [B])``
    of the chunk `rank_chunks` gives it, read by index (`vitlarge.data.repeats.IndexedRecords`) and padded to
    ``batch_size`` with its last record; a padding-only batch repeats the split's last record.

    ``shards``: ``[(shard path, index path)]`` of the split in the manifest's order; ``sizes``: its images'
    ``(height, width)`` in record order (`val_sizes`). ``features``: the records' (image, label) feature names, or
    `vitlarge.data.wds_shards.TAR_MEMBERS` for WebDataset tars, whose samples are read by index
    (`vitlarge.data.wds_shards.IndexedSamples`)."""

    def __init__(
        self,
        shards,
        sizes: np.ndarray,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        image_size: int,
        patch: int,
        features: tuple[str, str] = TF_SLIM_FEATURES,
    ):
        # lazy: keeps tfrecord off the dry run and a run's pre-flight checks (they use val_sizes)
        from vitlarge.data.repeats import IndexedRecords
        from vitlarge.data.wds_shards import TAR_MEMBERS, IndexedSamples  # lazy: as above

        if features == TAR_MEMBERS:
            self._records: IndexedRecords | IndexedSamples = IndexedSamples(shards)
        else:
            self._records = IndexedRecords(shards, world_size=world_size, features=features)
        n = self._records.num_examples
        if n != len(sizes):  # the manifest's counts were checked against the indexes (`shard_files`)
            raise RuntimeError(f"{len(sizes)} validation sizes for {n} records")
        self.batch_size = batch_size
        # Position k of the pass reads record _order[k]: the records by aspect ratio, stable (the identity for a split
        # stored in that order: float ratios keep the order of exact ones), the same on every rank.
        self._order = np.argsort(sizes[:, 1].astype(np.float64) / sizes[:, 0], kind="stable")
        self._shapes = chunk_shapes(sizes[self._order], batch_size, image_size, patch)
        self._chunks = rank_chunks(n, rank, world_size, batch_size)
        self.runs = len(self._chunks)
        self.num_examples_this_rank = sum(min(batch_size, n - c * batch_size) for c in self._chunks if c is not None)

    @property
    def shapes(self) -> set[Size]:
        """The crops this rank's pass forwards."""
        return {self._shapes[-1 if c is None else c] for c in self._chunks}

    def records(self, run: int) -> list[int]:
        """The ``batch_size`` records batch ``run`` of the pass holds, padding included."""
        n, chunk = self._records.num_examples, self._chunks[run % self.runs]
        if chunk is None:
            return [int(self._order[n - 1])] * self.batch_size
        first = chunk * self.batch_size
        real = [int(k) for k in self._order[first : min(n, first + self.batch_size)]]
        return real + [real[-1]] * (self.batch_size - len(real))

    def __call__(self, info: BatchInfo) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        run = info.iteration % self.runs
        chunk = self._chunks[run]
        height, width = self._shapes[-1 if chunk is None else chunk]
        encoded, labels = [], []
        for record in self.records(run):
            image, label = self._records.read(record)
            encoded.append(np.frombuffer(image, dtype=np.uint8))
            labels.append([label])
        crop = np.ones(self.batch_size, dtype=np.float32)
        return encoded, np.array(labels, dtype=np.int64), crop * height, crop * width

    def close(self) -> None:
        self._records.close()
