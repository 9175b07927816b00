"""The dataset manifest (``dataset.json``): the one format data_tools and vitlarge.data share.

A data directory holds TFRecord shards ``<split>-NNNNN-of-MMMMM``, a DALI index
``<shard>.idx`` next to each, and ``dataset.json``::

    {"format": "vitlarge.tfrecord", "format_version": 2,
     "tool": "data_tools.imagenet_to_tfrecord", "tool_version": "1.0.0",
     "num_classes": 1000, "label_offset": 1,
     "classes": [{"label": 1, "synset": "n01440764", "text": "tench, Tinca tinca"}, ...],
     "splits": {"train": {"num_examples": 1281167, "skipped": 0,
                          "shards": [{"file": "train-00000-of-01024", "index": "...idx",
                                      "num_records": 1251, "bytes": 140123456,
                                      "checksum": "crc32c:1a2b3c4d"}, ...]},
                "validation": {"num_examples": 50000, "skipped": 0, "order": "aspect",
                               "shards": [{"file": ..., "sizes": "validation-00000-of-00128.sizes"}, ...]}}}

The converter writes the validation split sorted by aspect ratio (width / height) and records each
of its images' ``(height, width)`` per shard, in record order, in a file beside the shard (``<shard>.sizes``:
two little-endian uint32 a record; ``order`` and ``sizes``: what rectangular validation reads,
`vitlarge.data.rect`, through `split_sizes`); a split without ``order`` is in the order its shards were
written, nothing promised. Manifests written before the sizes had their own file hold them inline
(``"sizes": [[333, 500], ...]``), which is still read. Keeping them out of the JSON keeps ``dataset.json`` the
size of its classes and shards (ImageNet-21K's: ~3.7 MB), whatever the number of images.

Every name the manifest lists is a file of the data directory itself, resolving inside it: the
data directory is where ``--data`` (``data.path``) resolves, so shards kept on another disk are
reached by making the data directory itself (or ``--data``) a symbolic link to the folder holding
them and ``dataset.json``, never by a link or path per shard leading out (docs/DATA.md). The one exception is
a manifest's ``data_dir``: an index folder (``make_index <folder> --out <index folder>``, for a data folder it
may not write) holds ``dataset.json``, the indexes and the sizes files, and names once, as an absolute path, the
folder holding the shards; every shard then resolves inside that folder (`shard_path`, the one place a shard's
name becomes a path). The schema and size cap are `vitlarge.data.manifest_schema`'s.

Stored labels are ``label_offset + class index`` (TF ImageNet records reserve 0 for
"background", so the offset is 1); loaders subtract the offset to yield 0..num_classes-1.

This module imports nothing heavy (no torch, no DALI) so the offline tools can use it.
"""

from __future__ import annotations

import array
import errno
import itertools
import json
import os
import shlex
import stat
import sys
from dataclasses import dataclass, field

import numpy as np

from vitlarge import command
from vitlarge.data import manifest_schema
from vitlarge.data.manifest_schema import (  # noqa: F401 (re-exported: the constants live with the schema)
    ASPECT_ORDER,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_CAP,
    MAX_SIDE,
    SIZES_SUFFIX,
    SPLITS,
    TAR_IMAGE_EXTS,
    TAR_INDEX_LINE_MAX,
    TAR_INDEX_VERSION,
    TAR_LABEL_EXT,
    TF_SLIM_FEATURES,
    WDS_FORMAT,
    ManifestProblem,
    NewerManifest,
    out_of_aspect_order,
    shard_parts,
)
from vitlarge.data.manifest_schema import SHARD_NAME_RE as SHARD_RE
from vitlarge.errors import UserError
from vitlarge.fileio import UnsafeFile, check_inside, open_regular, read_capped, write_atomic
from vitlarge.text import plural

MANIFEST_NAME = "dataset.json"
DEMO_DIRNAME = "digits"  # recipes/demo_digits.py's data.path is data/digits
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def convert_cmd() -> str:
    """The converter's command where this runs (`vitlarge.command`: a checkout's ``python -m data_tools...``, or
    installed ``vitlarge-convert``)."""
    return command("data_tools.imagenet_to_tfrecord")


def make_index_fix(data_dir: str, out: str | None = None) -> str:
    """The make_index command line for ``data_dir`` (``--out``: the index folder where it is another), its paths
    quoted for a shell."""
    line = f"{command('data_tools.make_index')} {shlex.quote(data_dir)}"
    return f"{line} --out {shlex.quote(out)}" if out is not None else line


def reindex_fix(manifest: Manifest) -> str:
    """The make_index command that writes ``manifest``'s indexes and ``dataset.json`` again: on its shards' folder,
    with ``--out`` its index folder where that is another (a read-only data set's)."""
    d, shards_at = manifest.data_dir, shard_root(manifest)
    return make_index_fix(d) if shards_at == d else make_index_fix(shards_at, d)


def shard_name(split: str, index: int, count: int) -> str:
    """``train-00000-of-01024``: the names TensorFlow's ImageNet scripts use (with a TFDS set's name for ``split``,
    ``imagenet2012-train.tfrecord-00000-of-01024``, TFDS's)."""
    return f"{split}-{index:05d}-of-{count:05d}"


def shard_set_problem(names) -> tuple[str, str] | None:
    """Why the shard file names among ``names`` are not one complete set per split: (what, fix), or None.

    A split's shards must be exactly ``<split>-00000-of-N`` .. ``<split>-(N-1)-of-N`` for one N: a
    second ``-of-M`` set is a leftover of another conversion (reading both trains on every image
    twice), a missing index is a partial copy. Names that are not shard names are ignored.
    """
    sets: dict[str, dict[tuple[str, int], set[int]]] = {}
    for name in names:
        parts = shard_parts(os.path.basename(name))
        if parts:
            stem, split, index, count = parts
            sets.setdefault(split, {}).setdefault((stem, count), set()).add(index)
    for split, by_count in sorted(sets.items()):
        if len(by_count) > 1:
            found = " and ".join(
                f"{stem}-*-of-{count:05d} ({plural(len(ix), 'file')})" for (stem, count), ix in sorted(by_count.items())
            )
            return (
                f"{len(by_count)} {split} shard sets, {found}",
                "delete the set you do not want (or convert into an empty --out)",
            )
        (((stem, count), ix),) = by_count.items()
        missing = sorted(set(range(count)) - ix)
        extra = sorted(i for i in ix if i >= count)
        if missing or extra:
            bad = [shard_name(stem, i, count) for i in (missing or extra)]
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            what = "lacks" if missing else "has an index past its count:"
            return (
                f"the {stem}-*-of-{count:05d} set {what} {bad[0]}{more}",
                "restore the missing shards or re-convert" if missing else "rename or remove it",
            )
    return None


@dataclass(frozen=True)
class ShardInfo:
    file: str  # relative to the data directory
    index: str  # DALI index, relative to the data directory
    num_records: int
    bytes: int
    checksum: str | None = None  # "crc32c:<hex>" of the whole file; None if never computed
    sizes: tuple[tuple[int, int], ...] | None = None  # (height, width) of each record's image, where held in memory
    sizes_file: str | None = None  # where a read manifest says they are (relative to the data directory)

    def to_dict(self) -> dict:
        """The manifest's form: ``sizes`` as the name of the file `write_manifest` writes them to
        (``<file>.sizes``), left out where not recorded."""
        doc = {"file": self.file, "index": self.index, "num_records": self.num_records, "bytes": self.bytes}
        doc["checksum"] = self.checksum  # (not asdict: it would copy the sizes, a tuple a record)
        if self.sizes is not None or self.sizes_file is not None:
            doc["sizes"] = self.file + SIZES_SUFFIX if self.sizes is not None else self.sizes_file
        return doc

    def same_shard(self, other: ShardInfo) -> bool:
        """Whether ``other`` describes the same shard file (name, records, bytes, checksum), wherever its sizes are."""
        return (self.file, self.index, self.num_records, self.bytes, self.checksum) == (
            other.file,
            other.index,
            other.num_records,
            other.bytes,
            other.checksum,
        )


@dataclass(frozen=True)
class ClassInfo:
    label: int  # stored label (class index + label_offset)
    synset: str
    text: str = ""


@dataclass
class Manifest:
    """What a data directory holds. ``data_dir`` is filled in by ``load_manifest``."""

    num_classes: int
    label_offset: int
    classes: list[ClassInfo]
    splits: dict[str, list[ShardInfo]]
    skipped: dict[str, int] = field(default_factory=dict)
    order: dict[str, str] = field(default_factory=dict)  # split -> its "order" where the manifest gives one
    tool: str = ""
    tool_version: str = ""
    data_dir: str = ""
    format: str = FORMAT  # or WDS_FORMAT: WebDataset tars in place (`vitlarge.data.wds_shards`)
    shard_dir: str = ""  # the manifest's "data_dir": the absolute folder of the shards, where not data_dir itself
    features: tuple[str, str] = TF_SLIM_FEATURES  # (image, label) feature names of each tf.train.Example

    def num_examples(self, split: str) -> int:
        return sum(s.num_records for s in self.shards(split))

    def shards(self, split: str) -> list[ShardInfo]:
        if split == "train" and not self.splits.get("train") and self.splits.get("validation"):
            raise UserError(
                f"{os.path.join(self.data_dir, MANIFEST_NAME)}: a validation split only (converted to evaluate on, "
                "vitlarge-evaluate --data): training needs a 'train' split; convert ROOT/train/<class>/* into it"
            )
        if split not in self.splits or not self.splits[split]:
            raise UserError(
                f"{os.path.join(self.data_dir, MANIFEST_NAME)}: no '{split}' shards listed; "
                f"convert a '{split}' split or run {make_index_fix(self.data_dir)}"
            )
        return self.splits[split]

    def to_json(self) -> str:
        """JSON with one class or shard per line: readable, and diffs stay small."""

        def rows(items: list, indent: str) -> str:
            docs = [x.to_dict() if isinstance(x, ShardInfo) else vars(x) for x in items]
            return "[\n" + ",\n".join(indent + " " + json.dumps(d) for d in docs) + "\n" + indent + "]"

        sized = any("sizes" in s.to_dict() for shards in self.splits.values() for s in shards)
        tfds = any(not SHARD_RE.match(s.file) for shards in self.splits.values() for s in shards)
        newest = self.format == WDS_FORMAT or bool(self.shard_dir) or self.features != TF_SLIM_FEATURES or tfds
        head: dict = {
            "format": self.format,
            "format_version": 3 if newest else 2 if sized else 1,  # the lowest whose readers know every key
            "tool": self.tool,
            "tool_version": self.tool_version,
            "num_classes": self.num_classes,
            "label_offset": self.label_offset,
        }
        if self.shard_dir:
            head["data_dir"] = self.shard_dir
        if self.features != TF_SLIM_FEATURES:
            head["features"] = dict(zip(("image", "label"), self.features))
        parts = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in head.items()]
        parts.append(f' "classes": {rows(self.classes, " ")}')
        splits = [
            f'  "{split}": {{"num_examples": {sum(s.num_records for s in shards)}, '
            f'"skipped": {self.skipped.get(split, 0)}, '
            + (f'"order": {json.dumps(self.order[split])}, ' if split in self.order else "")
            + f'"shards": {rows(shards, "  ")}}}'
            for split, shards in self.splits.items()
        ]
        parts.append(' "splits": {\n' + ",\n".join(splits) + "\n }")
        return "{\n" + ",\n".join(parts) + "\n}\n"


def _image_folder_hint(data_dir: str) -> str | None:
    """The fix when ``data_dir`` holds images rather than shards (an ImageFolder tree), else None.

    Looks at a bounded number of names: the folder's, and those of up to 3 of its sub-folders (and
    their sub-folders for a ROOT/train/<class>/ tree)."""

    def names(d: str, limit: int = 200) -> list[os.DirEntry]:
        try:
            with os.scandir(d) as it:
                return [e for _, e in zip(range(limit), it) if not e.name.startswith(".")]
        except OSError:
            return []

    def has_images(entries) -> bool:
        return any(e.name.lower().endswith(IMAGE_EXTENSIONS) and e.is_file() for e in entries)

    def dirs(entries) -> list[os.DirEntry]:
        return [e for e in entries if e.is_dir()][:3]

    top = names(data_dir)
    if any(shard_parts(e.name) for e in top):
        return None
    convert = f"{convert_cmd()} --src {{src}} --out {{src}}-tfrecord, then pass --data {{src}}-tfrecord"
    split_dirs = [e for e in top if e.name in ("train", "val") and e.is_dir()]
    if split_dirs and any(has_images(names(c.path)) for s in split_dirs for c in dirs(names(s.path))):
        return "this is an image folder (ROOT/train/<class>/*): convert it with " + convert.format(src=data_dir)
    if has_images(top) or any(has_images(names(c.path)) for c in dirs(top)):
        parent = os.path.dirname(os.path.normpath(data_dir)) or "."
        if os.path.basename(os.path.normpath(data_dir)) in ("train", "val"):
            return f"this is an image folder, a split of ROOT={parent}: convert ROOT with " + convert.format(src=parent)
        return (
            "this is an image folder: arrange it as ROOT/train/<class>/* (and ROOT/val/...) and convert it with "
            + convert.format(src="ROOT")
        )
    return None


def _holds_tars(data_dir: str, limit: int = 200) -> bool:
    """Whether ``data_dir`` has an ``_info.json`` or a ``.tar`` among its first ``limit`` names (a WebDataset set)."""
    try:
        with os.scandir(data_dir) as it:
            return any(e.name == "_info.json" or e.name.endswith(".tar") for _, e in zip(range(limit), it))
    except OSError:
        return False


def _holds_only_indexes(data_dir: str) -> bool:
    """Whether ``data_dir`` holds ``.idx`` files and none of their shards (``<shard>.idx``, ``<tar stem>.idx``)."""
    try:
        names = set(os.listdir(data_dir))
    except OSError:
        return False
    indexes = [n[: -len(".idx")] for n in names if n.endswith(".idx")]
    return bool(indexes) and not any(n in names or n + ".tar" in names for n in indexes)


def _missing_fix(data_dir: str) -> str:
    """What to do when ``data_dir`` or its manifest is missing: make the demo data, convert the images
    found there, or (the general case) convert or index."""
    if os.path.isdir(os.path.join(data_dir, ".progress")):  # data_tools' done-records: a conversion's output
        return (
            f"a conversion into {data_dir} did not finish (it writes {MANIFEST_NAME} last): rerun it with the same "
            f"arguments ({convert_cmd()} ...); it keeps complete shards and redoes the rest; if every shard is "
            f"there (a copy that left it out), {make_index_fix(data_dir)} writes it"
        )
    if os.path.basename(os.path.normpath(data_dir)) == DEMO_DIRNAME:
        return (
            f"the demo's digits data set is made with {command('data_tools.make_demo_dataset')} {data_dir} (a few "
            f"seconds); for other images convert with {convert_cmd()}"
        )
    if _holds_only_indexes(data_dir):
        return (
            f"it holds DALI indexes but no shards: an index folder whose make_index --out did not finish; rerun "
            f"{command('data_tools.make_index')} <data folder> --out {shlex.quote(data_dir)}"
        )
    if _holds_tars(data_dir):
        return (
            f"a WebDataset folder (tars and _info.json, timm's layout) is read in place once indexed: run "
            f"{make_index_fix(data_dir)} (with --out <index folder> where it is read-only)"
        )
    return _image_folder_hint(data_dir) or (
        f"convert images with {convert_cmd()}, or for existing shards run {make_index_fix(data_dir)}"
    )


def load_manifest(data_dir: str) -> Manifest:
    """Read and validate ``data_dir/dataset.json`` (`manifest_schema.parse`: types, ranges, bare names,
    at most ``MANIFEST_CAP`` bytes read); UserError naming it, what is wrong and the fix otherwise."""
    path = os.path.join(data_dir, MANIFEST_NAME)
    if not os.path.isdir(data_dir):
        raise UserError(f"{data_dir}: data directory does not exist; {_missing_fix(data_dir)}")
    if not os.path.lexists(path):
        raise UserError(f"{path}: missing; {_missing_fix(data_dir)}")
    fix = f"re-convert, or run {make_index_fix(data_dir)} to write it again from the shards"
    try:
        check_inside(path, data_dir)
        doc = manifest_schema.parse(read_capped(path, MANIFEST_CAP))
    except UnsafeFile as e:
        if e.errno == errno.EFBIG:  # make_index writes the sizes beside it and refuses to write a larger one
            fix = (
                f"a manifest of ImageNet-21K's size is ~4 MB, its images' sizes in files of their own; one written "
                f"before they were (sizes inline) is written again by {make_index_fix(data_dir)}"
            )
        raise UserError(f"{path}: {e.strerror}; {fix}") from None
    except OSError as e:
        raise UserError(f"{path}: unreadable ({e.strerror or e}); {fix}") from None
    except NewerManifest as e:
        raise UserError(
            f"{path}: {e}; update vitlarge to read it (a data folder is read, never rewritten, by an older one)"
        ) from None
    except ManifestProblem as e:
        raise UserError(f"{path}: invalid manifest ({e}); {fix}") from None
    return Manifest(
        num_classes=doc["num_classes"],
        label_offset=doc["label_offset"],
        classes=[ClassInfo(**c) for c in doc["classes"]],
        splits={split: [_shard_info(s) for s in shards] for split, shards in doc["splits"].items()},
        skipped=doc["skipped"],
        order=doc["order"],
        tool=doc["tool"],
        tool_version=doc["tool_version"],
        data_dir=data_dir,
        format=doc["format"],
        shard_dir=doc["data_dir"],
        features=doc["features"],
    )


def shard_root(manifest: Manifest) -> str:
    """The folder holding the manifest's shards: its ``data_dir`` where it names one (an index folder's), else the
    folder of ``dataset.json`` itself."""
    return manifest.shard_dir or manifest.data_dir


def shard_path(manifest: Manifest, name: str) -> str:
    """Where shard ``name`` (a bare name the manifest lists, `manifest_schema` checks it) is: the one place a shard's
    name becomes a path. Whether it is a regular file inside `shard_root` is `shard_files`' check (`confined_size`)."""
    return os.path.join(shard_root(manifest), name)


def _shard_info(doc: dict) -> ShardInfo:
    """A shard of `manifest_schema.parse`'s document (its ``sizes`` a file's name or, inline, a list of pairs)."""
    sizes = doc.get("sizes")
    return ShardInfo(
        doc["file"],
        doc["index"],
        doc["num_records"],
        doc["bytes"],
        doc["checksum"],
        tuple(sizes) if isinstance(sizes, list) else None,
        sizes if isinstance(sizes, str) else None,
    )


MAX_SIZED_RECORDS = 1 << 22
"""The most records of a split whose sizes `split_sizes` reads: 4,194,304, ~2.8x ImageNet-21K's 1.5M validation
images (rectangular validation reads the validation split's alone): the bound on what a manifest's ``num_records``
can make it hold, 32 MiB (8 bytes a record)."""

_SIZES_BLOCK = 1 << 18  # records compared at a time in the order check: its temporaries stay ~8 MB at any split size
_read_sizes: dict[tuple, np.ndarray] = {}  # the last split read, by its files' identities: read once per process


def split_sizes(manifest: Manifest, split: str) -> np.ndarray | None:
    """The ``(height, width)`` of each of the split's images in record order, an ``(n, 2)`` uint32 array (8 bytes a
    record, read-only: the one copy a process holds, shared by every caller that reads the same files), or None
    where a shard has none recorded. A sizes file is data from elsewhere: a regular file of the data directory (a
    link only to a file inside it), of exactly 8 bytes a record, every side 1..`MAX_SIDE`; and a split whose
    ``order`` is ``aspect`` is in that order. Anything else is one UserError naming the file and the fix."""
    shards = manifest.shards(split)
    if any(s.sizes is None and s.sizes_file is None for s in shards):
        return None
    d, fix = manifest.data_dir, make_index_fix(manifest.data_dir)
    total = sum(s.num_records for s in shards)
    if total > MAX_SIZED_RECORDS:
        raise UserError(
            f"{os.path.join(d, MANIFEST_NAME)}: the {split} split has {total:,} records, more than the "
            f"{MAX_SIZED_RECORDS:,} whose sizes are read; check the manifest, or set data.rect_val=false"
        )
    root = os.path.realpath(d)
    files: list[tuple[str, os.stat_result] | None] = []
    for s in shards:
        if s.sizes_file is None:
            files.append(None)
            continue
        path = os.path.join(d, s.sizes_file)
        try:
            confined_size(path, root)
            files.append((path, os.stat(path)))
        except FileNotFoundError:
            raise UserError(f"{path}: missing (the image sizes of {s.file}); run {fix}") from None
        except OSError as e:
            raise UserError(f"{path}: {e.strerror or e}; {CONFINED_FIX}") from None
    key = None
    if all(f is not None for f in files):  # sizes all in files: the same files (inode, size, time), the same sizes
        ids = tuple((p, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) for p, st in filter(None, files))
        key = (root, split, manifest.order.get(split), ids, tuple(s.num_records for s in shards))
        if key in _read_sizes:
            return _read_sizes[key]
    out = np.empty((total, 2), dtype="<u4")  # the files' own layout: each read lands in place, no copy
    at = 0
    for s, f in zip(shards, files):
        part = out[at : at + s.num_records]
        at += s.num_records
        if f is None:
            part[:] = np.asarray(s.sizes, dtype="<u4").reshape(-1, 2)  # inline: bounded by MANIFEST_CAP
            continue
        path, st = f
        try:
            got = _read_into(path, part) if st.st_size == part.nbytes else -1
        except OSError as e:
            raise UserError(f"{path}: {e.strerror or e}; {CONFINED_FIX}") from None
        if got != part.nbytes:
            raise UserError(
                f"{path}: {st.st_size:,} bytes, not 8 for each of the {s.num_records:,} records of {s.file}; run {fix}"
            )
        if part.size and not (part.min() >= 1 and part.max() <= MAX_SIDE):
            raise UserError(f"{path}: a side outside 1..{MAX_SIDE} pixels; run {fix}")
    bad = _first_narrower(out) if manifest.order.get(split) == ASPECT_ORDER else None
    if bad is not None:
        raise UserError(
            f"{os.path.join(d, MANIFEST_NAME)}: {split} record {bad} ({out[bad, 1]} x {out[bad, 0]}) is narrower "
            f"than the one before it, but the split's order is {ASPECT_ORDER!r}; run {fix}"
        )
    out.flags.writeable = False
    if key is not None:
        _read_sizes.clear()  # one split's sizes held at a time
        _read_sizes[key] = out
    return out


def _read_into(path: str, part: np.ndarray) -> int:
    """Reads regular file ``path`` into ``part``'s bytes; how many it read, or -1 where the file holds more."""
    view, got = part.data.cast("B"), 0  # part: rows of a C-ordered array, contiguous
    with open_regular(path) as f:
        while got < len(view) and (n := f.readinto(view[got:])):
            got += n
        return got if not f.read(1) else -1


def _first_narrower(sizes: np.ndarray) -> int | None:
    """The first of ``sizes`` (``(height, width)`` rows) narrower than the one before it (width / height compared
    exactly, as products of integers below 2**21), as `out_of_aspect_order` finds it; None where in order."""
    for lo in range(0, len(sizes) - 1, _SIZES_BLOCK):
        block = sizes[lo : lo + _SIZES_BLOCK + 1].astype(np.int64)
        h, w = block[:, 0], block[:, 1]
        narrower = np.flatnonzero(w[1:] * h[:-1] < w[:-1] * h[1:])
        if narrower.size:
            return lo + int(narrower[0]) + 1
    return None


def sizes_bytes(sizes: tuple[tuple[int, int], ...]) -> bytes:
    """A sizes file's bytes: each ``(height, width)`` as two little-endian uint32."""
    sides = array.array("I", itertools.chain.from_iterable(sizes))
    if sys.byteorder != "little":
        sides.byteswap()
    return sides.tobytes()


def validate_data_dir(data_dir: str) -> Manifest:
    """Everything a loader checks before DALI opens a file, for every split the manifest lists:
    `load_manifest` then `shard_files`. Returns the manifest or raises one-line UserError; reads
    only ``dataset.json`` (capped), each index (streamed) and 8 bytes per shard, all inside ``data_dir``."""
    m = load_manifest(data_dir)
    for split in m.splits:
        shard_files(m, split)
    return m


def write_manifest(manifest: Manifest, data_dir: str) -> str:
    """Write the sizes files of the shards that hold sizes, then ``dataset.json``, each atomically
    (`vitlarge.fileio.write_atomic`, inside ``data_dir``); return its path. A manifest larger than
    `MANIFEST_CAP` (more classes and shards than its readers take) is a UserError naming what it holds, and
    nothing is written; so is one `manifest_schema.parse` refuses (as `load_manifest` would), naming its problem."""
    path = os.path.join(data_dir, MANIFEST_NAME)
    text = manifest.to_json()
    try:  # a writer's "wrote" followed by its reader's refusal would leave an invalid file under the final name
        manifest_schema.parse(text.encode())
    except ManifestProblem as e:
        raise UserError(
            f"{path}: would be an invalid manifest ({e}); nothing written: fix the data set's source it names"
        ) from None
    if len(text.encode()) > MANIFEST_CAP:
        shards = sum(len(v) for v in manifest.splits.values())
        raise UserError(
            f"{path}: would be {len(text.encode()):,} bytes, more than the {MANIFEST_CAP:,}-byte cap its readers "
            f"take ({plural(len(manifest.classes), 'class', grouped=True)}, {plural(shards, 'shard', grouped=True)}; "
            "ImageNet-21K's is ~4 MB); write the data set in fewer, larger shards"
        )
    for shards in manifest.splits.values():
        for s in shards:
            if s.sizes is not None:
                write_atomic(os.path.join(data_dir, s.file + SIZES_SUFFIX), sizes_bytes(s.sizes), root=data_dir)
    write_atomic(path, text, root=data_dir)
    return path


def shard_files(manifest: Manifest, split: str) -> list[tuple[str, str]]:
    """The split's ``[(shard, index)]`` paths, after cheap consistency checks before DALI touches the files.

    The manifest must list one complete shard set for the split and the directory must hold no
    other shards of that split (a leftover set that a later ``make_index`` would merge in).
    Per shard (an lstat, the index file streamed, and one 8-byte read): the shard and its index are
    regular files of the data directory (a link only to a file inside it; never a FIFO or device),
    the shard has the size the manifest records (else truncated or replaced), its index lists
    ``num_records`` records tiling the file from 0 to its end (else stale), and the last record's
    length header agrees with the index. Content checksums are not verified here (that reads every byte);
    ``make_index`` recomputes them.
    """
    if manifest.format == WDS_FORMAT:
        return _tar_files(manifest, split)
    d, shards_at = manifest.data_dir, _shard_root_here(manifest)
    fix = reindex_fix(manifest)
    listed = [s.file for s in manifest.shards(split)]
    problem = shard_set_problem(listed)
    if problem:
        raise UserError(
            f"{os.path.join(d, MANIFEST_NAME)}: the {split} shards listed are not one complete set "
            f"({problem[0]}); {problem[1]}, then run {fix}"
        )
    try:
        present = os.listdir(shards_at)
    except OSError:
        present = []
    others = sorted(n for n in present if n not in set(listed) and (p := shard_parts(n)) and p[1] == split)
    if others:
        problem = shard_set_problem(listed + others)
        what = problem[0] if problem else f"{split} shards it does not list ({others[0]})"
        raise UserError(
            f"{shards_at}: holds {what}, but {MANIFEST_NAME} was built for {len(listed)} of them; delete the "
            f"set you do not use, then run {fix}"
        )
    root, shard_root_real = os.path.realpath(d), os.path.realpath(shards_at)
    out = []
    for s in manifest.shards(split):
        shard, index = shard_path(manifest, s.file), os.path.join(d, s.index)
        size = _listed_size(shard, shard_root_real, s, fix, ("shard", "TFRecord", "restore it, or re-convert"))
        try:
            if confined_size(index, root) > index_max_bytes(s.num_records):  # not a line per record: never read
                raise UserError(
                    f"{index}: larger than {s.num_records:,} records' lines ({index_max_bytes(s.num_records):,} "
                    f"bytes); a stale or padded DALI index: run {fix}"
                )
            with open_regular(index) as f:
                tiles = _index_tiles(f, s.num_records, size)
        except FileNotFoundError:
            raise UserError(f"{index}: missing DALI index for {shard}; run {fix}") from None
        except OSError as e:
            raise UserError(f"{index}: {e.strerror}; {CONFINED_FIX}") from None
        if tiles is None:
            raise UserError(f"{index}: stale DALI index (does not match {shard}); run {fix}")
        last_off, last_size = tiles
        if not _record_fits(shard, last_off, last_size):
            raise UserError(f"{index}: stale DALI index (does not match {shard}); run {fix}")
        out.append((shard, index))
    return out


def _listed_size(path: str, root: str, s: ShardInfo, fix: str, words: tuple[str, str, str]) -> int:
    """The size of shard ``path``, a regular file inside ``root`` of the size ``s`` records; else a one-line
    UserError: missing, truncated, changed, or not a regular file. ``words``: what a shard is called, what it is
    when truncated, and how to get a missing one back."""
    noun, kind, restore = words
    try:
        size = confined_size(path, root)
    except FileNotFoundError:
        raise UserError(f"{path}: {noun} listed in {MANIFEST_NAME} is missing; {restore} and rerun {fix}") from None
    except OSError as e:
        raise UserError(f"{path}: {e.strerror}; {CONFINED_FIX}") from None
    if size < s.bytes:
        raise UserError(
            f"{path}: truncated {kind} ({size} bytes, {MANIFEST_NAME} records {s.bytes}); re-copy or re-convert this shard"
        )
    if size != s.bytes:
        raise UserError(
            f"{path}: shard changed since {MANIFEST_NAME} was written ({size} bytes, expected {s.bytes}); run {fix}"
        )
    return size


def sample_members(line: str) -> dict[str, tuple[int, int]]:
    """``{ext: (data offset, size)}`` of one sample's line of a DALI tar index; empty where the line is not DALI's
    format."""
    parts = line.split()
    if len(parts) % 4:
        return {}
    out = {}
    for i in range(0, len(parts), 4):
        ext, at, size = parts[i : i + 3]
        if not (at.isdigit() and size.isdigit()):
            return {}
        out[ext.lower()] = (int(at), int(size))
    return out


def tar_sample_problem(members: dict[str, tuple[int, int]], tar_size: int) -> bool:
    """Whether a sample's index entry (`sample_members`) lacks its image or ``.cls``, or names bytes past its tar's
    ``tar_size``: the index is stale."""
    image = next((members[e] for e in TAR_IMAGE_EXTS if e in members), None)
    label = members.get(TAR_LABEL_EXT)
    return image is None or label is None or max(o + n for o, n in (image, label)) > tar_size


def _tar_index_fits(path: str, num_records: int, tar_size: int) -> bool:
    """Whether DALI index ``path`` is ``num_records`` samples of a tar of ``tar_size`` bytes: its first line
    (``v1.2 <samples>``) and as many sample lines, each with its image and ``.cls`` inside the tar (DALI's own
    error on a stale one is a raw RuntimeError). An index larger than `TAR_INDEX_LINE_MAX` bytes a sample is never
    read (`UnsafeFile`)."""
    lines = read_capped(path, TAR_INDEX_LINE_MAX * (num_records + 1)).split(b"\n")
    head = lines[0].split()
    if len(head) != 2 or head[0] != TAR_INDEX_VERSION.encode() or head[1] != str(num_records).encode():
        return False
    samples = [ln for ln in lines[1:] if ln.strip()]
    if len(samples) != num_records:
        return False
    try:
        return not any(tar_sample_problem(sample_members(ln.decode()), tar_size) for ln in samples)
    except UnicodeDecodeError:
        return False


def _shard_root_here(manifest: Manifest) -> str:
    """`shard_root`, or a one-line `UserError` where it is no folder here (an index folder's data set not mounted)."""
    d, shards_at = manifest.data_dir, shard_root(manifest)
    if not os.path.isdir(shards_at):
        raise UserError(
            f"{os.path.join(d, MANIFEST_NAME)}: its data_dir {shards_at} is not a folder here; mount the data set "
            f"there, or index it where it is with {command('data_tools.make_index')} <folder> --out {shlex.quote(d)}"
        )
    return shards_at


def _tar_files(manifest: Manifest, split: str) -> list[tuple[str, str]]:
    """`shard_files` of WebDataset tars (`WDS_FORMAT`): the split's ``[(tar, index)]`` paths, after the checks
    `shard_files` makes of a TFRecord set: each tar and index a regular file of its folder (a link only inside it), each tar of the
    size ``dataset.json`` records (else truncated or replaced), each index of the recorded sample count. The tars
    are in `shard_root` (an index folder's ``data_dir``), the indexes beside ``dataset.json``."""
    d, shards_at = manifest.data_dir, _shard_root_here(manifest)
    fix = reindex_fix(manifest)
    listed = [(shard_path(manifest, s.file), os.path.join(d, s.index), s) for s in manifest.shards(split)]
    real_shards_at, real_d = os.path.realpath(shards_at), os.path.realpath(d)
    for tar, index, s in listed:
        size = _listed_size(tar, real_shards_at, s, fix, ("tar", "tar", "restore it (its _info.json names it)"))
        try:
            confined_size(index, real_d)
            fits = _tar_index_fits(index, s.num_records, size)
        except FileNotFoundError:
            raise UserError(f"{index}: missing DALI index for {tar}; run {fix}") from None
        except OSError as e:
            raise UserError(f"{index}: {e.strerror}; {CONFINED_FIX}") from None
        if not fits:
            raise UserError(
                f"{index}: stale DALI index (not the {s.num_records:,} samples of {tar}, each image and .cls inside "
                f"it); run {fix}"
            )
    return [(tar, index) for tar, index, _ in listed]


CONFINED_FIX = (
    "a data folder holds its shards and indexes as regular files (links only to files inside it); to keep "
    "shards on another disk, point --data at the folder there (or a link to that folder): see docs/DATA.md"
)
INDEX_LINE_MAX = 48  # "offset size\n" with two integers below 2**64, and some spaces


def index_max_bytes(num_records: int) -> int:
    """The most bytes a DALI index of ``num_records`` records holds: a line of at most `INDEX_LINE_MAX` each (an
    index padded with 200 MiB of blank lines passed its line count and was read whole)."""
    return INDEX_LINE_MAX * max(1, num_records)


def confined_size(path: str, root: str) -> int:
    """Size of ``path`` if it is a regular file, or a link resolving to one inside ``root`` (the data
    directory, resolved); `UnsafeFile` for a link leading out, a FIFO, a device, a folder."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        check_inside(path, root)
        st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(0, "is not a regular file", path)
    return st.st_size


def _index_tiles(f, num_records: int, size: int) -> tuple[int, int] | None:
    """Streams a DALI index: (offset, size) of its last record if it has exactly ``num_records`` lines
    ``offset size``, each record starting where the previous ended, the first at 0 and the last ending
    at ``size``; None otherwise. Reads at most ``num_records + 1`` lines of ``INDEX_LINE_MAX`` bytes."""
    end, count, last = 0, 0, None
    while line := f.readline(INDEX_LINE_MAX):
        if not line.strip():
            continue
        count += 1
        parts = line.split()
        if count > num_records or len(parts) != 2 or not line.endswith(b"\n") and len(line) == INDEX_LINE_MAX:
            return None
        try:
            off, rec = int(parts[0]), int(parts[1])
        except ValueError:
            return None
        if off != end or rec < 16:
            return None
        end, last = off + rec, (off, rec)
    return last if count == num_records and end == size else None


def _record_fits(path: str, offset: int, size: int) -> bool:
    with open_regular(path) as f:
        f.seek(offset)
        head = f.read(8)
    return len(head) == 8 and int.from_bytes(head, "little") + 16 == size
