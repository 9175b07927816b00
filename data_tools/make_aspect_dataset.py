"""A data set whose classes show only near the long edges of each image: what a square crop cuts away.

    python -m data_tools.make_aspect_dataset data/aspect            # 2,000 train / 400 validation images

For measuring rectangular validation (``data.rect_val``, `vitlarge.data.rect`) against the square centre
crop. Each image is gray noise, ``SHORT`` pixels on its shorter side and 1 to 2.5 times that on its longer
one (landscape or portrait, equally likely), with a band of its class's colour across each end of the
longer side, 12-18% of it wide. A square centre crop (timm's, ``crop_pct`` 0.875) of an image wider than
about 1.3:1 keeps none of either band; a crop at the image's own aspect ratio keeps most of both. Four
classes (``red``, ``green``, ``blue``, ``yellow``), balanced, drawn with ``--seed``: the JPEGs go to
``OUT/src/{train,val}/<class>/`` and are converted by ``imagenet_to_tfrecord`` into ``OUT`` (the
validation split sorted by aspect ratio, with its sizes). Rerunning with complete output does nothing.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from vitlarge import command
from vitlarge.data.manifest import ASPECT_ORDER, MANIFEST_NAME, Manifest, load_manifest
from vitlarge.errors import UserError
from vitlarge.fileio import open_new, write_atomic

from . import imagenet_to_tfrecord

COLORS = {"red": (220, 30, 30), "green": (30, 190, 40), "blue": (30, 60, 220), "yellow": (230, 210, 20)}
SHORT = 24  # pixels on the shorter side (the benchmark validates at 16: a little downscaling, as ImageNet's)
ASPECTS = (1.0, 2.5)  # longer / shorter side, uniform
BAND = (0.12, 0.18)  # each band's width, a fraction of the longer side, uniform


def image(rng: np.random.Generator, color: tuple[int, int, int]) -> np.ndarray:
    """One image: ``[H, W, 3]`` uint8 gray noise with a ``color`` band across each end of its longer side."""
    long = int(round(SHORT * rng.uniform(*ASPECTS)))
    band = max(1, int(round(long * rng.uniform(*BAND))))
    gray = rng.integers(60, 196, size=(SHORT, long, 1), dtype=np.uint8)
    pixels = np.repeat(gray, 3, axis=2)
    pixels[:, :band] = color
    pixels[:, long - band :] = color
    return pixels if rng.random() < 0.5 else pixels.transpose(1, 0, 2).copy()  # portrait: the bands top and bottom


def write_jpegs(src: str, train: int, val: int, seed: int) -> None:
    """The ImageFolder tree: ``train`` and ``val`` images, classes in turn (skipped when a run finished it)."""
    done = os.path.join(src, ".complete")
    if os.path.exists(done):
        return
    from PIL import Image  # lazy: PIL only where the tree is not written yet

    rng = np.random.default_rng(seed)
    names = list(COLORS)
    for split, count in (("train", train), ("val", val)):
        for i in range(count):
            name = names[i % len(names)]
            d = os.path.join(src, split, name)
            os.makedirs(d, exist_ok=True)
            with open_new(os.path.join(d, f"{split}_{i:05d}.jpg")) as f:  # a planted link is replaced, not followed
                Image.fromarray(image(rng, COLORS[name])).save(f, "JPEG", quality=95)
    write_atomic(done, "ok\n", root=src)


def make_aspect_dataset(out: str, *, train: int = 2000, val: int = 400, seed: int = 0, workers: int = 0) -> Manifest:
    """Build (or find complete) the data set in ``out``; return its manifest."""
    try:
        m = load_manifest(out)
        counts = (m.num_examples("train"), m.num_examples("validation"))
        if counts == (train, val) and m.order.get("validation") == ASPECT_ORDER:
            return m
    except UserError:
        pass
    try:
        os.makedirs(out, exist_ok=True)
        write_jpegs(os.path.join(out, "src"), train, val, seed)
    except OSError as e:
        raise UserError(
            f"{e.filename or out}: cannot write the data set ({e.strerror}); choose a writable OUT"
        ) from None
    return imagenet_to_tfrecord.convert(os.path.join(out, "src"), out, workers=workers, progress=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command("data_tools.make_aspect_dataset"), description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--val", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.train < len(COLORS) or a.val < 1:
        p.error(f"need --train >= {len(COLORS)} and --val >= 1")

    def work() -> None:
        m = make_aspect_dataset(a.out, train=a.train, val=a.val, seed=a.seed)
        print(
            f"{os.path.join(a.out, MANIFEST_NAME)}: {m.num_examples('train')} train, "
            f"{m.num_examples('validation')} validation images, {m.num_classes} classes"
        )

    return imagenet_to_tfrecord.run_cli(work)  # Ctrl-C: one line, and the rerun resumes


if __name__ == "__main__":
    sys.exit(main())
