"""A synthetic data set whose every record is identifiable: its label is its index in the split.

    python -m data_tools.make_id_dataset /tmp/ids --train 64000 --train-shards 64

For measuring what the loaders read (each image exactly once per validation pass, how much one
epoch's order resembles the last) rather than what they learn. Every record holds the same tiny
JPEG (``--size`` pixels square, mid-gray) and the stored label ``i`` for the i-th record of its
split (label offset 0, ``num_classes`` = the larger split's size), so a batch's labels name its
records. Shards follow the converter's naming and carry a DALI index; ``dataset.json`` is
written last, so a directory with a manifest is complete.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

from vitlarge import command
from vitlarge.data.manifest import Manifest, ShardInfo, shard_name, write_manifest

from . import tfrecord_io

TOOL = "data_tools.make_id_dataset"


def tiny_jpeg(size: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), (128, 128, 128)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def make_id_dataset(
    out: str, *, train: int, train_shards: int, validation: int = 0, val_shards: int = 1, size: int = 8
) -> Manifest:
    """Write the shards and manifest into ``out``; return the manifest."""
    os.makedirs(out, exist_ok=True)
    jpeg = tiny_jpeg(size)
    splits = {}
    for split, count, shards in (("train", train, train_shards), ("validation", validation, val_shards)):
        if count == 0:
            continue
        splits[split] = []
        for s in range(shards):
            name = shard_name(split, s, shards)
            with tfrecord_io.ShardWriter(os.path.join(out, name)) as w:
                for i in range(count * s // shards, count * (s + 1) // shards):
                    w.write(
                        tfrecord_io.encode_example({"image/encoded": (jpeg, "byte"), "image/class/label": (i, "int")})
                    )
                done = w.commit()
            splits[split].append(ShardInfo(name, name + ".idx", done.num_records, done.bytes, done.checksum))
    m = Manifest(
        num_classes=max(train, validation),
        label_offset=0,
        classes=[],
        splits=splits,
        tool=TOOL,
        tool_version="1.0.0",
        data_dir=out,
    )
    write_manifest(m, out)
    return m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command("data_tools.make_id_dataset"), description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--train", type=int, required=True)
    p.add_argument("--train-shards", type=int, required=True)
    p.add_argument("--validation", type=int, default=0)
    p.add_argument("--val-shards", type=int, default=1)
    p.add_argument("--size", type=int, default=8)
    a = p.parse_args(argv)
    if min(a.train, a.train_shards, a.val_shards, a.size) < 1 or a.validation < 0 or a.train < a.train_shards:
        p.error("need --train >= --train-shards >= 1, --validation >= 0 and sizes >= 1")
    make_id_dataset(
        a.out, train=a.train, train_shards=a.train_shards, validation=a.validation, val_shards=a.val_shards, size=a.size
    )
    print(f"wrote {os.path.join(a.out, 'dataset.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
