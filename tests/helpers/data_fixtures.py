"""Session-scoped data fixtures: generated once per test session in a temporary directory.

- ``demo_data``: the digits data set (data_tools.make_demo_dataset), converted: 1,437 train /
  360 validation 32x32 images, 10 classes, 4 + 2 shards. Shared with the training tests.
- ``tiny_imagefolder``: a 3-class ImageNet-style JPEG tree (synset class names) of small photo
  crops, with the awkward cases real data has: a PNG named ``.JPEG``, a CMYK JPEG, a grayscale
  JPEG. Tests that damage it copy it first (``copy_imagefolder``). ``tiny_converted``: it as TFRecords.
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
