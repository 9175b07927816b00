"""Session-scoped data fixtures: generated once per test session in a temporary directory.

- ``demo_data``: the digits data set (data_tools.make_demo_dataset), converted: 1,437 train /
  360 validation 32x32 images, 10 classes, 4 + 2 shards. Shared with the training tests.
- ``tiny_imagefolder``: a 3-class ImageNet-style JPEG tree (synset class names) of small photo
  crops, with the awkward cases real data has: a PNG named ``.JPEG``, a CMYK JPEG, a grayscale
  JPEG. Tests that damage it copy it first (``copy_imagefolder``). ``tiny_converted``: it as TFRecords.
- ``small_tfds(out)``: a 9-record TFDS version folder written in TFDS's layout (a function: tests that damage it
  write their own).
- ``demo_wds``: the digits data set as WebDataset tars in timm's layout (the same records), indexed in place.
"""

from __future__ import annotations

import io
import os
import shutil

import numpy as np
import pytest
from PIL import Image

SYNSETS = ("n01440764", "n01443537", "n01484850")  # tench, goldfish, great white shark
TINY_TRAIN_PER_CLASS, TINY_VAL_PER_CLASS = 6, 2


def _photo_crops(count: int, seed: int) -> list[Image.Image]:
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        p = photos[i % len(photos)]
        h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
        y, x = int(rng.integers(0, p.shape[0] - h)), int(rng.integers(0, p.shape[1] - w))
        out.append(Image.fromarray(p[y : y + h, x : x + w]))
    return out


def make_tiny_imagefolder(root: str) -> str:
    """Write the tiny tree under ``root`` (``root/train/<synset>/``, ``root/val/<synset>/``)."""
    images = iter(_photo_crops(len(SYNSETS) * (TINY_TRAIN_PER_CLASS + TINY_VAL_PER_CLASS), seed=0))
    for split, per_class in (("train", TINY_TRAIN_PER_CLASS), ("val", TINY_VAL_PER_CLASS)):
        for c, synset in enumerate(SYNSETS):
            d = os.path.join(root, split, synset)
            os.makedirs(d, exist_ok=True)
            for i in range(per_class):
                im = next(images)
                path = os.path.join(d, f"{synset}_{split}_{i}.JPEG")
                if split == "train" and c == 0 and i == 0:
                    im.save(path, "PNG")  # a PNG with a .JPEG name: detected by content
                elif split == "train" and c == 1 and i == 0:
                    im.convert("CMYK").save(path, "JPEG", quality=90)
                elif split == "train" and c == 2 and i == 0:
                    im.convert("L").save(path, "JPEG", quality=90)
                else:
                    im.save(path, "JPEG", quality=90)
    return root


def make_colour_folder(root: str, classes: dict[str, int], per_class: int, split: str | None = "val") -> str:
    """``root/<split>/<class>/`` (``split`` None: ``root/<class>/``, a flat folder) of ``per_class`` 24 x 24 JPEGs per
    class, each class a hue of its own (``classes``: name -> hue 0..359) with noise: images a model tells apart by
    class, so a score computed against the wrong class shows. The same arguments write the same images."""
    from PIL import ImageColor

    rng = np.random.default_rng(0)
    for name, hue in classes.items():
        d = os.path.join(root, *([split] if split else []), name)
        os.makedirs(d, exist_ok=True)
        colour = np.array(ImageColor.getrgb(f"hsl({hue}, 90%, 50%)"), dtype=np.float32)
        for i in range(per_class):
            pixels = np.clip(colour + rng.normal(0, 12, (24, 24, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(os.path.join(d, f"{name}_{i}.jpg"), "JPEG", quality=90)
    return root


def copy_imagefolder(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    return dst


def corrupt_jpeg_bytes() -> bytes:
    """A JPEG cut in half: headers parse, the data ends early (no end marker)."""
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    return data[: len(data) // 2]


@pytest.fixture(scope="session")
def tiny_imagefolder(tmp_path_factory) -> str:
    return make_tiny_imagefolder(str(tmp_path_factory.mktemp("tiny_imagefolder")))


@pytest.fixture(scope="session")
def tiny_converted(tiny_imagefolder, tmp_path_factory) -> str:
    """``tiny_imagefolder`` converted (3 train, 2 validation shards); read only: tests that damage it copy it."""
    from data_tools import imagenet_to_tfrecord

    out = str(tmp_path_factory.mktemp("tiny_converted"))
    imagenet_to_tfrecord.convert(tiny_imagefolder, out, train_shards=3, val_shards=2, workers=0, progress=False)
    return out


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory) -> str:
    from data_tools.make_demo_dataset import make_demo_dataset

    out = str(tmp_path_factory.mktemp("demo_data"))
    make_demo_dataset(out, workers=0)
    return out


@pytest.fixture(scope="session")
def demo_wds(demo_data, tmp_path_factory) -> str:
    """The digits demo as a WebDataset set in timm's layout (`data_tools.make_wds_copy`: the same records, tar for
    shard), indexed in place by make_index."""
    from data_tools import make_index
    from data_tools.make_wds_copy import make_wds_copy

    d = make_wds_copy(demo_data, str(tmp_path_factory.mktemp("demo_wds") / "digits-wds"))
    make_index.make_index(d, workers=1)
    return d


@pytest.fixture(scope="session")
def id_datasets(tmp_path_factory):
    """{n: data dir} of identifiable validation splits (label = record index), 3 shards each."""
    from data_tools.make_id_dataset import make_id_dataset

    root = tmp_path_factory.mktemp("id_datasets")
    return {
        n: make_id_dataset(str(root / str(n)), train=9, train_shards=1, validation=n, val_shards=3).data_dir
        for n in ID_SPLIT_SIZES
    }


ID_SPLIT_SIZES = (24, 37, 50)  # 24 and 50 divide by some world sizes, 37 by none


def jpeg(width: int, height: int, shade: int = 90) -> bytes:
    """A flat-coloured RGB JPEG of ``width`` x ``height``."""
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (shade, 40, 200)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def bomb_jpeg(side: int = 60_000) -> bytes:
    """A few-hundred-byte JPEG whose frame header says ``side`` x ``side`` (60,000: 3.6 G pixels, 10.8 GB decoded):
    what a header read sees of a decompression bomb, nothing decoded."""
    data = bytearray(jpeg(8, 8))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = side.to_bytes(2, "big") * 2
    return bytes(data)


def big_png(side: int) -> bytes:
    """A PNG of a hundred bytes whose IHDR says ``side`` x ``side`` (grey, 8 bits), an empty eXIf before its data and
    its IEND in place: what a header read sees of a PNG decompression bomb (PIL's own guard raises at its header past
    twice its limit; the eXIf spares PIL's ``getexif`` a decode of the data to look for one after it)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"eXIf", b"MM\0*\0\0\0\x08\0\0")
        + chunk(b"IDAT", zlib.compress(b"\0"))
        + chunk(b"IEND", b"")
    )


def small_tfds(out, *, val_label: int = 1, val_image: bytes | None = None) -> str:
    """A 3-class TFDS version folder ``out`` in TFDS's layout (`data_tools.tfds_layout.write_tfds`): 2 train shards of 3
    records, 1 validation shard of 3 (30 x 30, 30 x 31, and 50 x 20 or ``val_image``, labelled 0, 1, ``val_label``),
    9 records in all."""
    train = [[(jpeg(40 + i, 30), i % 3, f"t{s}{i}.JPEG") for i in range(3)] for s in range(2)]
    val = [
        [(jpeg(30, 30 + i), i, f"v{i}.JPEG") for i in range(2)] + [(val_image or jpeg(50, 20), val_label, "v2.JPEG")]
    ]
    from data_tools import tfds_layout  # lazy: keeps data_tools off importing these fixtures, as above

    tfds_layout.write_tfds(str(out), "tinynet", {"train": train, "validation": val}, ["n01", "n02", "n03"])
    return str(out)
