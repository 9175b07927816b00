"""WebDataset shards read in place: the checks before DALI opens them, and their samples read by index.

A WebDataset folder in timm's layout (``timm/imagenet-1k-wds``) holds tars of samples ``<key>.jpg``,
``<key>.cls`` (the label, an ASCII integer) and ``<key>.json``; ``python -m data_tools.make_index`` writes a DALI
index per tar (``<name>.idx``, DALI's ``wds2idx`` format `TAR_INDEX_VERSION`: a line ``v1.2 <samples>``, then per
sample ``<ext> <data offset> <size> <member name>`` for each of its members) and ``dataset.json`` with
``"format": "vitlarge.webdataset"``. DALI's ``fn.readers.webdataset`` then reads the tars where they are
(`vitlarge.data.pipelines`), with the same order, padding and checkpoint as the TFRecord reader.

The tars and indexes are files from elsewhere, held here to what ``make_index`` recorded before DALI reads them
(`vitlarge.data.manifest.shard_files`: a stat and one bounded line per file), and read by index (`IndexedSamples`, rectangular
validation's source) only within their recorded size, each index read with a cap of `TAR_INDEX_LINE_MAX` bytes a
sample. Nothing here imports DALI.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from vitlarge.data.manifest import Manifest, make_index_fix, sample_members, tar_sample_problem
from vitlarge.data.manifest_schema import (
    TAR_IMAGE_EXTS,
    TAR_INDEX_LINE_MAX,
    TAR_LABEL_EXT,
    WDS_FORMAT,
)
from vitlarge.errors import UserError
from vitlarge.fileio import UnsafeFile, open_regular, read_capped

if TYPE_CHECKING:
    import torch

TAR_MEMBERS = (";".join(TAR_IMAGE_EXTS), TAR_LABEL_EXT)
"""A sample's (image, label): its members' extensions, in the place of the (image, label) features a TFRecord's
reader takes (`record_keys`), so the pipelines and readers take one value for both formats."""
LABEL_MAX_BYTES = 16  # a label's ASCII digits (at most 10: labels are below 2**31) and trailing whitespace
LABEL_RE = re.compile(rb"^(\d{1,10})\s*$")  # digits first: `ascii_labels` weighs each by its place


def record_keys(manifest: Manifest) -> tuple[str, str]:
    """What ``manifest``'s records hold their image and label under: `TAR_MEMBERS` for WebDataset tars, else the
    TFRecord features the manifest names."""
    return TAR_MEMBERS if manifest.format == WDS_FORMAT else manifest.features


def index_name(tar: str) -> str:
    """The DALI index of tar ``tar`` (a bare name): ``<name without .tar>.idx``, as ``wds2idx`` names it."""
    return tar[: -len(".tar")] + ".idx"


def parse_label(raw: bytes) -> int | None:
    """The label a ``.cls`` member holds (ASCII digits from its first byte, trailing whitespace allowed), or None."""
    m = LABEL_RE.match(raw) if len(raw) <= LABEL_MAX_BYTES else None
    return int(m.group(1)) if m else None


def ascii_labels(raw: torch.Tensor) -> torch.Tensor:
    """`parse_label` over a batch: ``raw`` is uint8 ``[B, W]``, each row a ``.cls`` member's bytes padded with spaces
    (`vitlarge.data.pipelines`' webdataset reader, ``W`` = `LABEL_MAX_BYTES`); int64 ``[B]``, -1 for a row that
    `parse_label` would not read, which the loader refuses (a tar changed since make_index: "x" must not read as
    0, nor "1 2" as 12). A row is a label when its first ``n`` bytes (1 to 10) are digits and the rest whitespace;
    digit ``i`` weighs ``10 ** (n - 1 - i)``."""
    import torch  # lazy: torch off make_index's path, which imports this module

    place = torch.arange(raw.shape[1])
    digit = (raw >= ord("0")) & (raw <= ord("9"))
    space = (raw == ord(" ")) | ((raw >= ord("\t")) & (raw <= ord("\r")))  # Python's bytes \s
    n = digit.sum(1, keepdim=True)
    lead = place < n
    valid = (n[:, 0] >= 1) & (n[:, 0] <= 10) & (digit == lead).all(1) & (space | lead).all(1)
    weight = torch.pow(10, (n - 1 - place).clamp(min=0)) * lead
    return torch.where(valid, ((raw.long() - ord("0")) * weight).sum(1), -1)


class IndexedSamples:
    """A split's samples read by index, as `vitlarge.data.repeats.IndexedRecords` reads TFRecords: sample ``k``
    is the ``k``-th of the tars' concatenation; ``read(k)`` is ``(encoded image, label)``. Each member is read
    at the offset its index gives, which must lie inside its tar; a label that is no integer reads as -1 (the
    loader then refuses it). ``shards``: `vitlarge.data.manifest.shard_files`' ``[(tar, index)]``."""

    def __init__(self, shards):
        self._paths: list[str] = []
        self._files: dict[int, BinaryIO] = {}
        rows: list[tuple[int, int, int, int, int]] = []  # owner, image offset, size, label offset, size
        for owner, (path, index) in enumerate(shards):
            size = os.path.getsize(path)
            data_dir, index_dir = os.path.dirname(path), os.path.dirname(index)
            fix = make_index_fix(data_dir, index_dir if index_dir != data_dir else None)  # --out: a read-only set's
            try:
                lines = read_capped(index, TAR_INDEX_LINE_MAX * (size // 512 + 1)).decode().splitlines()
            except (UnsafeFile, UnicodeDecodeError) as e:
                raise UserError(
                    f"{index}: {getattr(e, 'strerror', e)}; a stale or padded DALI index: run {fix}"
                ) from None
            self._paths.append(path)
            for line in lines[1:]:
                members = sample_members(line)
                if tar_sample_problem(members, size):
                    raise UserError(
                        f"{index}: stale DALI index (a sample without its image or label in {path}); run {fix}"
                    )
                image = next(members[e] for e in TAR_IMAGE_EXTS if e in members)
                rows.append((owner, *image, *members[TAR_LABEL_EXT]))
        self._rows = np.array(rows, dtype=np.int64).reshape(-1, 5)
        self.num_examples = len(self._rows)

    def read(self, sample: int) -> tuple[bytes, int]:
        owner, image_at, image_size, label_at, label_size = (int(x) for x in self._rows[sample])
        if owner not in self._files:  # a validation split's tars, each opened once (ImageNet's: 64)
            self._files[owner] = open_regular(self._paths[owner])
        f = self._files[owner]
        f.seek(image_at)
        image = f.read(image_size)
        f.seek(label_at)
        label = parse_label(f.read(min(label_size, LABEL_MAX_BYTES + 1)))
        return image, (-1 if label is None else label)

    def close(self) -> None:
        for f in getattr(self, "_files", {}).values():
            f.close()
        self._files = {}

    __del__ = close
