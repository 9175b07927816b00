"""An image-folder tree written as a Hugging Face parquet data set, as the Hub lays out ``ILSVRC/imagenet-1k``.

    python -m data_tools.make_parquet_dataset data/digits/src /tmp/digits-parquet

``OUT/data/{train,validation}-NNNNN-of-NNNNN.parquet`` written by ``datasets`` itself (``Dataset.from_dict`` with
an ``Image`` and a ``ClassLabel`` feature, ``to_parquet``): each image's file bytes as they are, its file name as
``path``, the class folders' sorted names as the ClassLabel's names; rows in the tree's order (class by class: the
order that a converter must not keep), ``--rows-per-group`` rows a row group (the Hub's image sets: 100). For the
tests and benchmarks of the parquet source (`data_tools.parquet_source`), and for trying it on one's own data.
"""

from __future__ import annotations

import argparse
import os
import sys

from vitlarge import command
from vitlarge.errors import UserError, cli_main

from .imagefolder import discover

SPLIT_NAMES = {"train": "train", "validation": "validation"}


def write_parquet(tree: str, out: str, *, files_per_split: int = 1, rows_per_group: int = 100) -> dict[str, int]:
    """Write ``tree`` (``train/<class>/*``, ``val/<class>/*``) as parquet shards under ``out/data``; return the
    rows written per split."""
    # lazy: datasets (and its pyarrow, pandas) only where a parquet set is written
    import datasets

    datasets.disable_progress_bars()  # a bar per file written, on stderr
    classes, splits = discover(tree, None, 0)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    written = {}
    for split, items in splits.items():
        count = max(1, min(files_per_split, len(items)))
        for i in range(count):
            part = items[i * len(items) // count : (i + 1) * len(items) // count]
            rows = {
                "image": [{"bytes": _read(it.path), "path": os.path.basename(it.path)} for it in part],
                "label": [it.label for it in part],
            }
            name = f"{SPLIT_NAMES[split]}-{i:05d}-of-{count:05d}.parquet"
            ds = datasets.Dataset.from_dict(rows, features=features)
            ds.to_parquet(os.path.join(out, "data", name), batch_size=rows_per_group)
        written[split] = len(items)
    return written


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command("data_tools.make_parquet_dataset"), description=__doc__.split("\n\n")[0])
    p.add_argument("tree", help="ROOT with ROOT/train/<class>/* and ROOT/val/<class>/*")
    p.add_argument("out")
    p.add_argument("--files-per-split", type=int, default=1)
    p.add_argument("--rows-per-group", type=int, default=100)
    a = p.parse_args(argv)

    def work() -> None:
        if a.files_per_split < 1 or a.rows_per_group < 1:
            raise UserError("--files-per-split and --rows-per-group must be >= 1")
        counts = write_parquet(a.tree, a.out, files_per_split=a.files_per_split, rows_per_group=a.rows_per_group)
        print(f"{os.path.join(a.out, 'data')}: " + ", ".join(f"{s}: {n:,} images" for s, n in counts.items()))

    return cli_main(work)


if __name__ == "__main__":
    sys.exit(main())
