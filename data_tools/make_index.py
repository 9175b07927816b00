"""Write DALI indexes and ``dataset.json`` for TFRecord shards made elsewhere (e.g. TensorFlow).

    python -m data_tools.make_index /data/imagenet-tf      # shards train-* and validation-*

Reads every record once (checking framing and CRCs, so a truncated shard is reported by name),
writes ``<shard>.idx`` next to each shard and a manifest inferred from what it saw: splits from
the file names, record counts, label offset 1 (the TF ImageNet convention, ``--label-offset`` to
change) and ``num_classes`` from the largest label seen (``--num-classes`` to state it, e.g. a
split that lacks the last class). Each split must be one complete ``-of-N`` set: a directory
that mixes sets or lacks a shard is refused, naming the files, before anything is written.
Class synsets and texts come from the records when present.
Rerun it whenever a loader reports a missing or stale index.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import sys

from vitlarge.data.manifest import (
    MANIFEST_NAME,
    SHARD_RE,
    ClassInfo,
    Manifest,
    ShardInfo,
    load_manifest,
    shard_set_problem,
    write_manifest,
)
from vitlarge.errors import UserError, cli_main

from . import tfrecord_io

TOOL = "data_tools.make_index"
TOOL_VERSION = "1.0.0"


def _label_info(payload: bytes) -> tuple[int | None, str, str]:
    ex = tfrecord_io._EXAMPLE()
    ex.ParseFromString(payload)
    feat = ex.features.feature

    def text(key: str) -> str:
        values = feat[key].bytes_list.value if key in feat else []
        return values[0].decode("utf-8", "replace") if values else ""

    label = feat["image/class/label"].int64_list.value[0] if "image/class/label" in feat else None
    return label, text("image/class/synset"), text("image/class/text")


def index_shard(path: str) -> tuple[str, int, int, str, dict]:
    """Index one shard; return (name, records, bytes, checksum, {label: (synset, text)})."""
    n, size, checksum, labels = tfrecord_io.write_index_for(path, parse=_label_info)
    seen: dict[int, tuple[str, str]] = {}
    for label, synset, text in labels:
        if label is None:
            raise UserError(f"{path}: record without 'image/class/label'; not an image classification shard")
        seen.setdefault(label, (synset, text))
    return os.path.basename(path), n, size, checksum, seen


def make_index(data_dir: str, *, label_offset: int = 1, num_classes: int | None = None, workers: int = 1) -> Manifest:
    if not os.path.isdir(data_dir):
        raise UserError(f"{data_dir}: directory does not exist; pass the directory holding train-*/validation-* shards")
    names = sorted(n for n in os.listdir(data_dir) if SHARD_RE.match(n))
    if not names:
        raise UserError(
            f"{data_dir}: no shards named train-NNNNN-of-NNNNN or validation-NNNNN-of-NNNNN; rename the shards "
            "to that scheme (TensorFlow's ImageNet script uses it)"
        )
    problem = shard_set_problem(names)
    if problem:
        raise UserError(
            f"{data_dir}: {problem[0]}; {problem[1]}, then rerun python -m data_tools.make_index {data_dir}"
        )
    paths = [os.path.join(data_dir, n) for n in names]
    if workers > 1 and len(paths) > 1:
        with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            results = list(pool.map(index_shard, paths))
    else:
        results = [index_shard(p) for p in paths]

    seen: dict[int, tuple[str, str]] = {}
    splits: dict[str, list[ShardInfo]] = {}
    for name, n, size, checksum, labels in results:
        for k, v in labels.items():
            seen.setdefault(k, v)
        split = SHARD_RE.match(name).group(1)
        splits.setdefault(split, []).append(ShardInfo(name, name + ".idx", n, size, checksum))
    lo, hi = min(seen), max(seen)
    if lo < label_offset:
        raise UserError(
            f"{data_dir}: label {lo} is below --label-offset {label_offset}; pass --label-offset {lo} "
            "(0 for shards whose labels start at 0)"
        )
    inferred = hi - label_offset + 1
    if num_classes is None:
        num_classes = inferred
    elif num_classes < inferred:
        raise UserError(
            f"{data_dir}: label {hi} is outside --num-classes {num_classes} with offset {label_offset}; "
            f"pass --num-classes {inferred} or more"
        )
    classes = [ClassInfo(k, *seen[k]) for k in sorted(seen)] if all(s for s, _ in seen.values()) else []
    m = Manifest(
        num_classes=num_classes,
        label_offset=label_offset,
        classes=classes,
        splits=splits,
        tool=TOOL,
        tool_version=TOOL_VERSION,
        data_dir=data_dir,
    )
    try:
        write_manifest(m, data_dir)
    except OSError as e:
        raise UserError(
            f"{os.path.join(data_dir, MANIFEST_NAME)}: cannot write ({e.strerror}); make the directory writable"
        ) from None
    counts = ", ".join(f"{s}: {m.num_examples(s):,} records in {len(v)} shards" for s, v in splits.items())
    print(
        f"wrote {len(paths)} indexes and {os.path.join(data_dir, MANIFEST_NAME)}: {counts}; "
        f"{num_classes} classes, label offset {label_offset}",
        file=sys.stderr,
    )
    return load_manifest(data_dir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_tools.make_index", description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir")
    p.add_argument("--label-offset", type=int, default=1, help="stored label of class 0 (TF ImageNet: 1)")
    p.add_argument("--num-classes", type=int, help="default: inferred from the largest label")
    p.add_argument("--workers", type=int, default=os.cpu_count())
    a = p.parse_args(argv)
    return cli_main(
        lambda: make_index(a.data_dir, label_offset=a.label_offset, num_classes=a.num_classes, workers=a.workers)
    )


if __name__ == "__main__":
    sys.exit(main())
