"""Hugging Face parquet shards as the converter's source: the image bytes copied into TFRecords as they are.

    python -m data_tools.imagenet_to_tfrecord --src /data/imagenet-1k --out /data/imagenet-tfr --workers 16

The layout of the Hub's ``ILSVRC/imagenet-1k`` (and of ``datasets``' ``to_parquet`` / ``push_to_hub``):
``SRC/data/<split>-NNNNN-of-NNNNN.parquet`` (or the parquet files in SRC itself), an ``image`` column (a struct
of the encoded ``bytes`` and the file's ``path``: ``datasets.Image``) and a ``label`` column whose class names
are in the schema's ``huggingface`` metadata (``datasets.ClassLabel``). Splits by file name: ``train``, and
``validation`` (or ``val``, ``valid``); ``test`` files carry no labels and are left out, said in one line.

Each image is what the folder converter makes of a file (`imagefolder.prepare_bytes`): a colour JPEG's bytes
unchanged, anything else upright, opaque and re-encoded. Parquet is read with pyarrow one row group at a time, only
the image's bytes and path and the label (`Columns`), a few rows at a time: what a row group reads is bounded
(`MAX_ROW_GROUP_BYTES`, `MAX_ROW_GROUP_ROWS`, `plain_bytes`) and so is a file's footer (`MAX_FOOTER`). Training
shards take the row groups in a seeded random order, each row group's rows in a seeded random order (a shard of
ImageNet's 1,252 images draws from about 13 places of the set where the Hub's row groups hold 100 rows; the loader
shuffles again every epoch). The validation split is written sorted by aspect ratio with each image's size, as the
folder converter writes it (``data.rect_val``): its images are read once for their sizes and copied to a spill file
in ``OUT/.progress`` (removed at the end), from which its shards are written in that order. Resumable as the folder
converter: done-records, the same command resumes. This module reads; the converter
(`imagenet_to_tfrecord.convert_parquet`) plans and writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from vitlarge.data.manifest import shard_name
from vitlarge.data.manifest_schema import MAX_CLASSES, MAX_SYNSET
from vitlarge.errors import UserError
from vitlarge.fileio import open_new, open_regular
from vitlarge.text import plural

from . import imagefolder, val_order
from .imagefolder import BadImage, Item, Prepared

SPLITS = {"train": "train", "validation": "validation", "val": "validation", "valid": "validation"}
UNLABELLED = ("test",)
MAX_FOOTER = 64 << 20  # bytes of a file's metadata; the Hub's ImageNet files hold ~3,000 row groups in ~2 MB
MAX_ROW_GROUP_BYTES = 1 << 30  # uncompressed; the Hub writes image sets in row groups of 100 rows (~11 MB)
MAX_ROW_GROUP_ROWS = 1 << 20  # pyarrow's default row group; a footer may claim billions of run-length rows
READ_ROWS = 32  # rows of a row group read at a time
PLAIN_CHUNK_MAX = 32 << 20  # file bytes of a row group's image fields read as plain values (the Hub's: ~11 MB)
PLAIN_BATCH_BYTES = 64 << 20  # the most a batch of plain values holds: fewer rows a batch past 2 MiB a row group
PLAIN_ENCODINGS = {"PLAIN", "RLE", "BIT_PACKED"}  # values as stored (RLE, BIT_PACKED: the struct's levels)
NAME_MAX = 255  # characters of a file name (ext4's limit is 255 bytes)
NO_BYTES = "no image bytes (a path-only image: vitlarge never reads paths from a parquet file)"
SPILL = "validation.spill"
_NAME_RE = re.compile(r"^([A-Za-z]+)[-_.]")


def parquet_files(src: str) -> list[str]:
    """The parquet files of a Hub data set folder (``SRC/data/*.parquet``, else ``SRC/*.parquet``), sorted; [] where
    ``src`` is not one (an image-folder tree)."""
    for folder in (os.path.join(src, "data"), src):
        if os.path.isdir(folder):
            found = sorted(
                os.path.join(folder, imagefolder.check_name(folder, n, "file name"))
                for n in os.listdir(folder)
                if n.endswith(".parquet") and not n.startswith(".")
            )
            if found:
                return found
    return []


def is_parquet_source(src: str) -> bool:
    """Whether ``src`` is a folder of parquet shards rather than an ImageFolder tree (which has ``train/``)."""
    return os.path.isdir(src) and not os.path.isdir(os.path.join(src, "train")) and bool(parquet_files(src))


@dataclass(frozen=True)
class Source:
    """One parquet file: its size and its row groups' row counts."""

    path: str
    size: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of a row group (in its seeded row order) that a training shard takes."""

    path: str
    group: int
    start: int
    stop: int
    size: int  # an estimate of its bytes, for progress

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class ValSlice:
    """Validation images ``[start, stop)`` in aspect order (resolved from the spill's index once written)."""

    start: int
    stop: int
    size: int = 0

    @property
    def rows(self) -> int:
        return self.stop - self.start


def _open(path: str, dictionary: tuple[int, ...] = ()) -> pq.ParquetFile:
    """The file's reader after a bounded look at its footer; a UserError naming the file where it is no parquet.
    ``dictionary``: leaf columns read dictionary-encoded, by index (`Reader`)."""
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size < 12:
                raise UserError(_damaged(path, f"{size} bytes"))
            f.seek(size - 8)
            tail = f.read(8)
        footer = int.from_bytes(tail[:4], "little")
        if tail[4:] != b"PAR1":
            raise UserError(_damaged(path, "no parquet end marker"))
        if footer > min(MAX_FOOTER, size - 12):
            raise UserError(
                f"{path}: a parquet footer of {footer:,} bytes, more than the file or the {MAX_FOOTER:,} bytes read "
                "from one (a memory guard); download the file again"
            )
        return pq.ParquetFile(path, memory_map=False, read_dictionary=list(dictionary) or None)
    except UserError:
        raise
    except (OSError, ValueError, pa.ArrowException) as e:
        raise UserError(_damaged(path, str(e).splitlines()[0] if str(e) else type(e).__name__)) from None


def _damaged(path: str, why: str) -> str:
    return f"{path}: not a readable parquet file ({why}); download it again or remove it"


def _features(path: str, pf: pq.ParquetFile) -> tuple[str, str, list[str]]:
    """(image column, label column, class names) from the ``huggingface`` schema metadata."""
    meta = (pf.schema_arrow.metadata or {}).get(b"huggingface")
    features = {}
    if meta is not None:
        try:
            features = json.loads(meta).get("info", {}).get("features", {})
        except (ValueError, AttributeError, RecursionError):
            raise UserError(f"{path}: its 'huggingface' metadata is not JSON; write the file with datasets") from None
    if not isinstance(features, dict):
        features = {}
    typed = {k: v.get("_type") for k, v in features.items() if isinstance(v, dict)}
    images = [k for k, t in typed.items() if t == "Image"] or [
        k for k in ("image", "img") if k in pf.schema_arrow.names
    ]
    labels = [k for k, t in typed.items() if t == "ClassLabel"]
    fix = "write it with datasets (an Image and a ClassLabel feature), as the Hub's ILSVRC/imagenet-1k"
    if len(images) != 1 or images[0] not in pf.schema_arrow.names:
        raise UserError(f"{path}: no image column (datasets' Image feature: a struct of bytes and path); {fix}")
    column = pf.schema_arrow.field(images[0]).type
    if not (pa.types.is_struct(column) and column.get_field_index("bytes") >= 0):
        raise UserError(f"{path}: the column {images[0]!r} is {column}, not a struct of bytes and path; {fix}")
    if len(labels) != 1 or labels[0] not in pf.schema_arrow.names:
        raise UserError(f"{path}: no label column with class names (datasets' ClassLabel feature); {fix}")
    if not pa.types.is_integer(pf.schema_arrow.field(labels[0]).type):
        raise UserError(f"{path}: the label column {labels[0]!r} is not an integer column; {fix}")
    names = features[labels[0]].get("names")
    if not (isinstance(names, list) and 1 <= len(names) <= MAX_CLASSES and all(isinstance(n, str) for n in names)):
        raise UserError(f"{path}: the label column {labels[0]!r} lists no class names; {fix}")
    for n in names:
        imagefolder.check_name(path, n, "class name")
        if not n or len(n) > MAX_SYNSET:
            raise UserError(f"{path}: a class name of {len(n):,} characters (1 to {MAX_SYNSET:,}); fix the metadata")
    if len(set(names)) != len(names):
        raise UserError(f"{path}: class names listed twice in its ClassLabel; fix the metadata")
    if pf.schema_arrow.names.count(images[0]) != 1 or pf.schema_arrow.names.count(labels[0]) != 1:
        raise UserError(f"{path}: two columns named {images[0]!r} or {labels[0]!r}; {fix}")
    for field, types in (("bytes", (pa.binary(), pa.large_binary())), ("path", (pa.string(), pa.large_string()))):
        found = [f.type for f in column if f.name == field]
        if (found or field == "bytes") and (len(found) != 1 or found[0] not in types):
            what = f"{len(found)} fields" if len(found) != 1 else f"of type {found[0]}"
            raise UserError(f"{path}: the image's {field!r} is {what}, not one {types[0]} field; {fix}")
    return images[0], labels[0], names


@dataclass(frozen=True)
class Columns:
    """Where a file's image and label are: their names, and the leaf columns read, by index: the image's
    ``bytes`` and ``path`` fields, the label. Indices come from the schema's structure, never from dotted names,
    which a crafted file makes ambiguous (a column named ``image.nest`` beside a field ``nest`` of ``image``):
    nothing else of the file is read."""

    image: str
    label: str
    data: int
    path: int | None
    label_leaf: int

    @property
    def image_leaves(self) -> tuple[int, ...]:
        return (self.data,) if self.path is None else (self.data, self.path)

    @property
    def read(self) -> list[int]:
        """The leaves read, image first (a batch's columns are then ``(image, label)``)."""
        return [*self.image_leaves, self.label_leaf]


def _leaves(t: pa.DataType) -> int:
    """The parquet leaf columns an Arrow type of a parquet file's schema takes, in the schema's order."""
    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _leaves(t.value_type)
    return 1


def columns(path: str, pf: pq.ParquetFile, image: str, label: str) -> Columns:
    """``pf``'s image and label columns (`_features`') and their leaf indices; a UserError naming the file where
    its Arrow schema does not give its parquet leaves one for one."""
    start, at = 0, {}
    for field in pf.schema_arrow:
        at[field.name] = start
        start += _leaves(field.type)
    if start != pf.metadata.num_columns:
        raise UserError(
            _damaged(path, f"its schema has {start:,} leaf columns, its footer {pf.metadata.num_columns:,}")
        )
    column = pf.schema_arrow.field(image).type
    leaf, children = at[image], {}
    for child in column:
        children[child.name] = leaf
        leaf += _leaves(child.type)
    return Columns(image, label, children["bytes"], children.get("path"), at[label])


def discover(src: str) -> tuple[list[str], dict[str, list[Source]]]:
    """(class names in label order, {split: its files}); UserError naming the file for any that cannot be read,
    lacks a column, disagrees on the classes or holds a label outside them (label columns only are read)."""
    files = parquet_files(src)
    if not files:
        raise UserError(f"{src}: no parquet files in it or in its data/ folder; pass the data set's folder as --src")
    classes: list[str] | None = None
    splits: dict[str, list[Source]] = {}
    left_out = []
    for path in files:
        prefix = _NAME_RE.match(os.path.basename(path))
        split = SPLITS.get(prefix.group(1).lower()) if prefix else None
        if prefix and prefix.group(1).lower() in UNLABELLED:
            left_out.append(path)
            continue
        if split is None:
            raise UserError(
                f"{path}: no split in its name; name it train-NNNNN-of-NNNNN.parquet or validation-..., as the Hub "
                "does, or move it out of --src"
            )
        pf = _open(path)
        image, label, names = _features(path, pf)
        where = columns(path, pf, image, label)
        if classes is None:
            classes = names
        elif names != classes:
            raise UserError(f"{path}: its class names differ from {files[0]}'s; convert files of one data set")
        meta = pf.metadata
        groups = tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups))
        for g in range(meta.num_row_groups):
            if meta.row_group(g).total_byte_size > MAX_ROW_GROUP_BYTES:
                raise UserError(
                    f"{path}: row group {g} holds {meta.row_group(g).total_byte_size:,} bytes, more than the "
                    f"{MAX_ROW_GROUP_BYTES:,} read at a time (a memory guard); rewrite it with smaller row groups"
                )
            if meta.row_group(g).num_rows > MAX_ROW_GROUP_ROWS:  # its labels are read whole, next
                raise UserError(
                    f"{path}: row group {g} holds {meta.row_group(g).num_rows:,} rows, more than the "
                    f"{MAX_ROW_GROUP_ROWS:,} read at a time (a memory guard); rewrite it with smaller row groups"
                )
            _check_labels(path, pf, g, where.label_leaf, len(names))
        splits.setdefault(split, []).append(Source(path, os.path.getsize(path), groups))
    if left_out:
        print(f"left out {plural(len(left_out), 'unlabelled file')} ({left_out[0]}, ...): no labels", file=sys.stderr)
    if classes is None or not splits:
        raise UserError(f"{src}: no train-*.parquet or validation-*.parquet file; name the files as the Hub does")
    if "train" not in splits:  # as a folder without train/: a set to evaluate an export on
        print(f"{src} has no train-*.parquet: converting its validation split only, to evaluate on", file=sys.stderr)
    return classes, splits


class Reader:
    """One parquet file's row groups of (image, label), each read the cheaper way that stays bounded: plain where
    `plain_bytes` allows it (`_plain_rows`), else with the image's fields dictionary-encoded (a reader opened on
    first need), a value many rows share then held once (50 rows sharing one 20 MB value: a footer of 20 MB,
    2.2 GB read plain). Only the leaves `Columns` names are read."""

    def __init__(self, path: str):
        self.path, self.plain = path, _open(path)
        self.columns = columns(path, self.plain, *_features(path, self.plain)[:2])
        self._dictionary: pq.ParquetFile | None = None

    def rows(self, group: int) -> list[tuple[object, object, int]]:
        """Row group ``group`` as `_rows` gives it."""
        stored = plain_bytes(self.plain.metadata.row_group(group), self.columns.image_leaves)
        if stored is not None:
            return self._plain_rows(group, stored)
        if self._dictionary is None:
            self._dictionary = _open(self.path, self.columns.image_leaves)
        return _rows(_batches(self.path, self._dictionary, group, self.columns.read))

    def _plain_rows(self, group: int, stored: int) -> list[tuple[object, object, int]]:
        """Row group ``group`` read plain, in batches of at most `PLAIN_BATCH_BYTES` (a value holds at most the
        ``stored`` bytes of its chunks), each turned into Python values as it is read; a UserError naming the file
        where the values come to more than ``stored``, which plain values never do (a crafted or damaged file)."""
        batch_rows = max(1, min(READ_ROWS, PLAIN_BATCH_BYTES // max(stored, 1)))
        rows, held = [], 0
        try:
            for batch in self.plain.reader.iter_batches(
                batch_rows, row_groups=[group], column_indices=self.columns.read, use_threads=False
            ):
                values = _rows([batch])
                held += sum(len(data or b"") + len(path or "") for data, path, _ in values)
                if held > stored:
                    raise UserError(
                        f"{self.path}: row group {group} reads as more than the {stored:,} bytes its image column "
                        "holds in the file (a crafted or damaged file); download it again"
                    )
                rows += values
        except (OSError, ValueError, pa.ArrowException) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UserError(_damaged(self.path, f"row group {group}: {why}")) from None
        return rows


def plain_bytes(group: pq.RowGroupMetaData, leaves: tuple[int, ...]) -> int | None:
    """The file bytes of row group ``group``'s image fields (``leaves``: `Columns.image_leaves`) where they may be
    read as plain values, else None: each field's column chunk stored uncompressed, plainly
    encoded, with no dictionary page, all in at most `PLAIN_CHUNK_MAX` bytes (``datasets``' writer: image bytes
    plain and uncompressed). Such a chunk's pages are read as the file holds them, within the chunk's bytes
    (Arrow's "Page was smaller than expected" past them), so whatever its pages say (a footer that hides a
    dictionary page or another encoding) a value holds no more bytes than the chunks, and the plain values of a
    row group, together, no more than the chunks either (`Reader._plain_rows` checks it). Reading plain skips what
    the dictionary-encoded read costs (each value hashed and copied into a dictionary; docs/PERFORMANCE.md section
    2); other chunks keep it, where a value many rows share (a dictionary page, or a compressed page that
    decompresses to one) is then held once."""
    chunks = [group.column(i) for i in leaves]
    plain = all(
        c.compression == "UNCOMPRESSED" and not c.has_dictionary_page and set(c.encodings) <= PLAIN_ENCODINGS
        for c in chunks
    )
    stored = sum(c.total_compressed_size for c in chunks)
    return stored if plain and stored <= PLAIN_CHUNK_MAX else None


def _batches(path: str, pf: pq.ParquetFile, group: int, leaves: list[int]) -> list[pa.RecordBatch]:
    """Row group ``group``'s ``leaves`` (`Columns.read`), `READ_ROWS` rows a batch; a UserError naming the file
    where the batches hold more than `MAX_ROW_GROUP_BYTES` in all (the footer's sizes are the file's claim: this
    is what is read)."""
    batches, held = [], 0
    try:
        for batch in pf.reader.iter_batches(READ_ROWS, row_groups=[group], column_indices=leaves, use_threads=False):
            held += batch.nbytes
            if held > MAX_ROW_GROUP_BYTES:
                raise UserError(
                    f"{path}: row group {group} reads as more than {MAX_ROW_GROUP_BYTES:,} bytes (a memory guard); "
                    "rewrite it with smaller row groups"
                )
            batches.append(batch)
    except (OSError, ValueError, pa.ArrowException) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(_damaged(path, f"row group {group}: {why}")) from None
    return batches


def _rows(batches: list[pa.RecordBatch]) -> list[tuple[object, object, int]]:
    """Each row of ``batches`` (image, label columns) as ``(its bytes, its path, its label)``, the first two as
    `_values` gives them (`_py` turns each into its Python value)."""
    rows = []
    for batch in batches:
        images, labels = batch.column(0), batch.column(1).to_pylist()
        data = _values(images.field("bytes"))
        paths = _values(images.field("path")) if images.type.get_field_index("path") >= 0 else [None] * len(labels)
        rows += zip(data, paths, labels)
    return rows


def _values(column: pa.Array) -> list:
    """``column``'s values: a plain column's as Python values (bytes, str or None: one copy each, of a batch
    `_batches` bounded), a dictionary-encoded column's as ``(dictionary, index)`` references, each copied only
    when `_py` takes it (an Arrow scalar of a binary value is a copy: 50 rows sharing one 20 MB value would be
    1 GB again; indexing the dictionary is ~2x faster than a DictionaryScalar a row)."""
    if isinstance(column, pa.DictionaryArray):
        return [(column.dictionary, i) for i in column.indices.to_pylist()]
    return column.to_pylist()


def _py(value: object) -> Any:
    """The Python value (bytes, str, or None) of a `_values` entry."""
    if not isinstance(value, tuple):
        return value
    array, index = value
    return None if index is None else array.slice(index, 1).to_pylist()[0]


def _check_labels(path: str, pf: pq.ParquetFile, group: int, leaf: int, num_classes: int) -> None:
    """Every label of row group ``group`` (leaf column ``leaf``) is one of the classes, and there are as many as
    its footer says rows (fewer: a shard would find its rows missing and call its images unreadable)."""
    try:  # the workers are the parallelism
        labels = pf.reader.read_row_group(group, column_indices=[leaf], use_threads=False).column(0).to_pylist()
    except (OSError, ValueError, pa.ArrowException) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(_damaged(path, f"row group {group}: {why}")) from None
    rows = pf.metadata.row_group(group).num_rows
    if len(labels) != rows:
        raise UserError(
            _damaged(path, f"row group {group} holds {len(labels):,} labels, its footer says {rows:,} rows")
        )
    for row, v in enumerate(labels):
        if v is None or not 0 <= v < num_classes:
            raise UserError(
                f"{path}: row group {group}, row {row}: label {v} outside the {num_classes:,} classes of its "
                "ClassLabel; fix the label or remove the row (an unlabelled test split is named test-*.parquet)"
            )


def _row_order(path: str, group: int, rows: int, seed: int | None) -> list[int]:
    order = list(range(rows))
    if seed is not None:
        random.Random(f"{seed}:{os.path.basename(path)}:{group}").shuffle(order)
    return order


def plan_train(sources: list[Source], num_shards: int, seed: int) -> list[tuple[str, list[Piece]]]:
    """``num_shards`` training shards (fewer where there are fewer rows) of near-equal size, cut from the row groups
    in a seeded random order."""
    groups = [(s, g, n) for s in sources for g, n in enumerate(s.groups) if n]
    random.Random(seed).shuffle(groups)
    total = sum(n for _, _, n in groups)
    count = min(total, num_shards)
    bounds = [i * total // count for i in range(count + 1)]
    shards: list[list[Piece]] = [[] for _ in range(count)]
    at, shard = 0, 0
    for s, g, n in groups:
        per_row = s.size / max(1, sum(s.groups))
        start = 0
        while start < n:
            while at + start >= bounds[shard + 1]:
                shard += 1
            stop = min(n, bounds[shard + 1] - at)
            shards[shard].append(Piece(s.path, g, start, stop, int(per_row * (stop - start))))
            start = stop
        at += n
    return [(shard_name("train", i, count), pieces) for i, pieces in enumerate(shards)]


def plan_val(sources: list[Source], num_shards: int) -> list[tuple[str, list[ValSlice]]]:
    """``num_shards`` validation shards of near-equal size, slices of the split in aspect order."""
    total = sum(sum(s.groups) for s in sources)
    count = min(total, num_shards)
    name = shard_name
    return [
        (name("validation", i, count), [ValSlice(i * total // count, (i + 1) * total // count)]) for i in range(count)
    ]


def items_digest(items: list, sources: dict[str, Source]) -> str:
    """What a shard's items read, for its inputs digest: each piece's file (path, size), row group and rows; a
    validation shard's slice and every validation file (``sources``: the split's files by path)."""
    h = hashlib.sha256()
    if items and isinstance(items[0], ValSlice):  # its images depend on every validation file
        for s in sorted(sources.values(), key=lambda s: s.path):
            h.update(os.fsencode(f"\n{s.path}|{s.size}|{s.groups}"))
    for it in items:
        if isinstance(it, Piece):
            h.update(os.fsencode(f"\n{it.path}|{sources[it.path].size}|{it.group}|{it.start}|{it.stop}"))
        else:
            h.update(f"\n{it.start}|{it.stop}".encode())
    return h.hexdigest()


def spill_validation(sources: list[Source], spill: str, max_pixels: int) -> list[tuple]:
    """Copy every validation image, in source order, to ``spill``; return them in aspect order as
    ``(offset, length, label, name)``, images whose size cannot be read from their header last (as
    `val_order.aspect_sorted` places them)."""
    rows = []
    if os.path.lexists(spill):  # a stopped run's
        os.remove(spill)
    with open_new(spill) as f:
        for s in sources:
            reader = Reader(s.path)
            for g in range(len(s.groups)):
                for row, (data, path, label) in enumerate(reader.rows(g)):
                    payload = _py(data) or b""
                    key = val_order.aspect_key(val_order.header_size(payload, max_pixels))
                    name = _item_path(s.path, g, row, _py(path), bool(payload))
                    rows.append((key, len(rows), f.tell(), len(payload), label, name))
                    f.write(payload)
    rows.sort(key=lambda r: (r[0], r[1]))
    return [(offset, length, label, name) for _, _, offset, length, label, name in rows]


def _item_path(path: str, group: int, row: int, name: str | None, has_bytes: bool = True) -> str:
    """How a row is named in messages and its record's ``image/filename`` (the basename): the image's own path
    inside the parquet file where it has one, else its row group and row. A row without bytes is named by its row
    group and row whatever its path says: vitlarge never reads a path from a parquet file, and a message naming
    ``<file>.parquet/passwd`` would present one as read; so is one whose path's last part is longer than
    `NAME_MAX` characters, which no file has (it would go into every message and its record)."""
    base = os.path.basename(name) if isinstance(name, str) and has_bytes else ""
    inner = base if 0 < len(base) <= NAME_MAX else f"group{group}-row{row}"
    return os.path.join(path, imagefolder.check_name(path, inner, "image path"))


def shard_images(items: list, opts: dict) -> Iterator[tuple[Item, Prepared | BadImage]]:
    """A shard's rows, each prepared for its record (`imagefolder.prepare_bytes`) or why it cannot be: a training
    shard's pieces read one row group at a time, a validation shard's images from the spill."""
    classes, offset = opts["classes"], opts["label_offset"]

    def prepared(payload: bytes, label: int, name: str) -> tuple[Item, Prepared | BadImage]:
        item = Item(name, label + offset, classes[label], "", len(payload))
        if not payload:
            return item, BadImage(name, NO_BYTES)
        try:
            return item, imagefolder.prepare_bytes(payload, name, opts["check"], opts["max_pixels"])
        except BadImage as e:
            return item, e

    opened: dict[str, Reader] = {}
    for it in items:
        if isinstance(it, ValSlice):
            with open_regular(opts["spill"]) as f:
                for at, length, label, name in opts["spilled"][it.start : it.stop]:
                    yield prepared(os.pread(f.fileno(), length, at), label, name)
            continue
        if it.path not in opened:
            opened[it.path] = Reader(it.path)
        rows = opened[it.path].rows(it.group)
        for row in _row_order(it.path, it.group, len(rows), opts["seed"])[it.start : it.stop]:
            data, path, label = rows[row]
            payload = _py(data) or b""
            name = _item_path(it.path, it.group, row, _py(path), bool(payload))
            yield prepared(payload, label, name)
