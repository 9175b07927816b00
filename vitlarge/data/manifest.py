"""The dataset manifest (``dataset.json``): the one format data_tools and vitlarge.data share.

A data directory holds TFRecord shards ``<split>-NNNNN-of-MMMMM``, a DALI index
``<shard>.idx`` next to each, and ``dataset.json``::

    {"format": "vitlarge.tfrecord", "format_version": 1,
     "tool": "data_tools.imagenet_to_tfrecord", "tool_version": "1.0.0",
     "num_classes": 1000, "label_offset": 1,
     "classes": [{"label": 1, "synset": "n01440764", "text": "tench, Tinca tinca"}, ...],
     "splits": {"train": {"num_examples": 1281167, "skipped": 0,
                          "shards": [{"file": "train-00000-of-01024", "index": "...idx",
                                      "num_records": 1251, "bytes": 140123456,
                                      "checksum": "crc32c:1a2b3c4d"}, ...]},
                "validation": {...}}}

Stored labels are ``label_offset + class index`` (TF ImageNet records reserve 0 for
"background", so the offset is 1); loaders subtract the offset to yield 0..num_classes-1.

This module imports nothing heavy (no torch, no DALI) so the offline tools can use it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field

from vitlarge.errors import UserError
from vitlarge.fileio import write_atomic

MANIFEST_NAME = "dataset.json"
FORMAT = "vitlarge.tfrecord"
FORMAT_VERSION = 1
SPLITS = ("train", "validation")
SHARD_RE = re.compile(r"^(train|validation)-(\d{5})-of-(\d{5})$")
MAKE_INDEX_FIX = "python -m data_tools.make_index {dir}"


def shard_name(split: str, index: int, count: int) -> str:
    """``train-00000-of-01024``: the names TensorFlow's ImageNet scripts use."""
    return f"{split}-{index:05d}-of-{count:05d}"


def shard_set_problem(names) -> tuple[str, str] | None:
    """Why the shard file names among ``names`` are not one complete set per split: (what, fix), or None.

    A split's shards must be exactly ``<split>-00000-of-N`` .. ``<split>-(N-1)-of-N`` for one N: a
    second ``-of-M`` set is a leftover of another conversion (reading both trains on every image
    twice), a missing index is a partial copy. Names that are not shard names are ignored.
    """
    sets: dict[str, dict[int, set[int]]] = {}
    for name in names:
        m = SHARD_RE.match(os.path.basename(name))
        if m:
            sets.setdefault(m.group(1), {}).setdefault(int(m.group(3)), set()).add(int(m.group(2)))
    for split, by_count in sorted(sets.items()):
        if len(by_count) > 1:
            found = " and ".join(
                f"{split}-*-of-{count:05d} ({len(ix)} files)" for count, ix in sorted(by_count.items())
            )
            return (
                f"{len(by_count)} {split} shard sets, {found}",
                "delete the set you do not want (or convert into an empty --out)",
            )
        ((count, ix),) = by_count.items()
        missing = sorted(set(range(count)) - ix)
        extra = sorted(i for i in ix if i >= count)
        if missing or extra:
            bad = [shard_name(split, i, count) for i in (missing or extra)]
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            what = "lacks" if missing else "has an index past its count:"
            return (
                f"the {split}-*-of-{count:05d} set {what} {bad[0]}{more}",
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
    tool: str = ""
    tool_version: str = ""
    data_dir: str = ""

    def num_examples(self, split: str) -> int:
        return sum(s.num_records for s in self.shards(split))

    def shards(self, split: str) -> list[ShardInfo]:
        if split not in self.splits or not self.splits[split]:
            raise UserError(
                f"{os.path.join(self.data_dir, MANIFEST_NAME)}: no '{split}' shards listed; "
                f"convert a '{split}' split or run {MAKE_INDEX_FIX.format(dir=self.data_dir)}"
            )
        return self.splits[split]

    def to_json(self) -> str:
        """JSON with one class or shard per line: readable, and diffs stay small."""

        def rows(items: list, indent: str) -> str:
            return "[\n" + ",\n".join(indent + " " + json.dumps(asdict(x)) for x in items) + "\n" + indent + "]"

        head = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tool": self.tool,
            "tool_version": self.tool_version,
            "num_classes": self.num_classes,
            "label_offset": self.label_offset,
        }
        parts = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in head.items()]
        parts.append(f' "classes": {rows(self.classes, " ")}')
        splits = [
            f'  "{split}": {{"num_examples": {sum(s.num_records for s in shards)}, '
            f'"skipped": {self.skipped.get(split, 0)}, "shards": {rows(shards, "  ")}}}'
            for split, shards in self.splits.items()
        ]
        parts.append(' "splits": {\n' + ",\n".join(splits) + "\n }")
        return "{\n" + ",\n".join(parts) + "\n}\n"


def load_manifest(data_dir: str) -> Manifest:
    """Read and validate ``data_dir/dataset.json``; UserError naming it and the fix otherwise."""
    path = os.path.join(data_dir, MANIFEST_NAME)
    fix = (
        "convert images with python -m data_tools.imagenet_to_tfrecord, or for existing shards run "
        + MAKE_INDEX_FIX.format(dir=data_dir)
    )
    if not os.path.isdir(data_dir):
        raise UserError(f"{data_dir}: data directory does not exist; {fix}")
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{path}: missing; {fix}") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: unreadable or not JSON ({e}); {fix}") from None
    try:
        if doc.get("format") != FORMAT or doc.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"format {doc.get('format')!r} version {doc.get('format_version')!r}, "
                f"expected {FORMAT!r} version {FORMAT_VERSION}"
            )
        m = Manifest(
            num_classes=int(doc["num_classes"]),
            label_offset=int(doc["label_offset"]),
            classes=[ClassInfo(**c) for c in doc.get("classes", [])],
            splits={split: [ShardInfo(**s) for s in body["shards"]] for split, body in doc["splits"].items()},
            skipped={split: int(body.get("skipped", 0)) for split, body in doc["splits"].items()},
            tool=doc.get("tool", ""),
            tool_version=doc.get("tool_version", ""),
            data_dir=data_dir,
        )
        if m.num_classes < 1:
            raise ValueError(f"num_classes is {m.num_classes}")
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path}: invalid manifest ({e}); {fix}") from None
    return m


def write_manifest(manifest: Manifest, data_dir: str) -> str:
    """Write ``dataset.json`` atomically (`vitlarge.fileio.write_atomic`); return its path."""
    path = os.path.join(data_dir, MANIFEST_NAME)
    write_atomic(path, manifest.to_json())
    return path


def check_shards(manifest: Manifest, split: str) -> list[tuple[str, str]]:
    """Cheap consistency checks before DALI touches the files; return [(shard, index)] paths.

    The manifest must list one complete shard set for the split and the directory must hold no
    other shards of that split (a leftover set that a later ``make_index`` would merge in).
    Per shard (a stat, the index file, and one 8-byte read): the shard exists and has the size the
    manifest records (else truncated or replaced), its index exists, lists ``num_records`` records
    and ends exactly at the end of the file (else stale), and the last record's length header
    agrees with the index. Content checksums are not verified here (that reads every byte);
    ``make_index`` recomputes them.
    """
    d = manifest.data_dir
    fix = MAKE_INDEX_FIX.format(dir=d)
    listed = [s.file for s in manifest.shards(split)]
    problem = shard_set_problem(listed)
    if problem:
        raise UserError(
            f"{os.path.join(d, MANIFEST_NAME)}: the {split} shards listed are not one complete set "
            f"({problem[0]}); {problem[1]}, then run {fix}"
        )
    try:
        present = os.listdir(d)
    except OSError:
        present = []
    others = sorted(n for n in present if n not in set(listed) and (m := SHARD_RE.match(n)) and m.group(1) == split)
    if others:
        problem = shard_set_problem(listed + others)
        what = problem[0] if problem else f"{split} shards it does not list ({others[0]})"
        raise UserError(
            f"{d}: holds {what}, but {MANIFEST_NAME} was built for {len(listed)} of them; delete the "
            f"set you do not use, then run {fix}"
        )
    out = []
    for s in manifest.shards(split):
        shard, index = os.path.join(d, s.file), os.path.join(d, s.index)
        try:
            size = os.path.getsize(shard)
        except OSError:
            raise UserError(
                f"{shard}: shard listed in {MANIFEST_NAME} is missing; restore it, or re-convert and rerun {fix}"
            ) from None
        if size < s.bytes:
            raise UserError(
                f"{shard}: truncated TFRecord ({size} bytes, {MANIFEST_NAME} records {s.bytes}); "
                "re-copy or re-convert this shard"
            )
        if size != s.bytes:
            raise UserError(
                f"{shard}: shard changed since {MANIFEST_NAME} was written ({size} bytes, "
                f"expected {s.bytes}); run {fix}"
            )
        try:
            with open(index) as f:
                lines = f.read().split("\n")
        except OSError:
            raise UserError(f"{index}: missing DALI index for {shard}; run {fix}") from None
        lines = [ln for ln in lines if ln.strip()]
        stale = f"{index}: stale DALI index (does not match {shard}); run {fix}"
        if len(lines) != s.num_records or not lines:
            raise UserError(stale)
        try:
            last_off, last_size = (int(x) for x in lines[-1].split())
        except ValueError:
            raise UserError(stale) from None
        if last_off + last_size != size or not _record_fits(shard, last_off, last_size):
            raise UserError(stale)
        out.append((shard, index))
    return out


def _record_fits(path: str, offset: int, size: int) -> bool:
    with open(path, "rb") as f:
        f.seek(offset)
        head = f.read(8)
    return len(head) == 8 and int.from_bytes(head, "little") + 16 == size
