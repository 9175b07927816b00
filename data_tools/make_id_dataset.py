"""A synthetic data set whose every record is identifiable: its label is its index in the split.

    python -m data_tools.make_id_dataset /tmp/ids --train 64000 --train-shards 64

For measuring what the loaders read (each image exactly once per validation pass, how much one
epoch's order resembles the last) rather than what they learn. Every record holds the same tiny
JPEG (``--size`` pixels square, mid-gray) and the stored label ``i`` for the i-th record of its
split (label offset 0, ``num_classes`` = the larger split's size), so a batch's labels name its
records. Shards follow the converter's naming and carry a DALI index; ``dataset.json`` is
written last, so a directory with a manifest is complete. ``val_sizes`` (``[(height, width)]``, one per
validation record) makes each validation image mid-gray of its own size instead, the split sorted by
aspect ratio with its sizes in the manifest, as the converter writes it (for rectangular validation).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from fractions import Fraction

from vitlarge import command
from vitlarge.data.manifest import ASPECT_ORDER, Manifest, ShardInfo, shard_name, write_manifest

from . import tfrecord_io

TOOL = "data_tools.make_id_dataset"


def tiny_jpeg(size: int, width: int | None = None) -> bytes:
    """A mid-gray JPEG ``size`` pixels high and ``width`` (default ``size``) wide."""
    from PIL import Image  # lazy: PIL only where a JPEG is made

    buf = io.BytesIO()
    Image.new("RGB", (width or size, size), (128, 128, 128)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def make_id_dataset(
    out: str,
    *,
    train: int,
    train_shards: int,
    validation: int = 0,
    val_shards: int = 1,
    size: int = 8,
    val_sizes: list[tuple[int, int]] | None = None,
) -> Manifest:
    """Write the shards and manifest into ``out``; return the manifest."""
    os.makedirs(out, exist_ok=True)
    jpeg = tiny_jpeg(size)
    sizes = sorted(val_sizes, key=lambda s: Fraction(s[1], s[0])) if val_sizes else None
    if sizes is not None:
        validation = len(sizes)
    splits = {}
    for split, count, shards in (("train", train, train_shards), ("validation", validation, val_shards)):
        if count == 0:
            continue
        splits[split] = []
        for s in range(shards):
            name = shard_name(split, s, shards)
            records = range(count * s // shards, count * (s + 1) // shards)
            with tfrecord_io.ShardWriter(os.path.join(out, name)) as w:
                for i in records:
                    image = tiny_jpeg(*sizes[i]) if split == "validation" and sizes else jpeg
                    w.write(
                        tfrecord_io.encode_example({"image/encoded": (image, "byte"), "image/class/label": (i, "int")})
                    )
                done = w.commit()
            own = tuple(sizes[i] for i in records) if split == "validation" and sizes else None
            splits[split].append(ShardInfo(name, name + ".idx", done.num_records, done.bytes, done.checksum, own))
    m = Manifest(
        num_classes=max(train, validation),
        label_offset=0,
        classes=[],
        splits=splits,
        order={"validation": ASPECT_ORDER} if sizes else {},
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
