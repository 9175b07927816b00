"""A tiny real data set: scikit-learn's handwritten digits as JPEG shards (a few seconds, CPU).

    python -m data_tools.make_demo_dataset data/digits

1,797 real 8x8 grayscale digits (10 classes, shipped inside scikit-learn), upscaled to 32x32
(bilinear) and written as RGB JPEG (quality 95) to ``OUT/src/{train,val}/<digit>/`` with a fixed
stratified 80/20 split (seed 0), then converted by ``imagenet_to_tfrecord`` into ``OUT`` (4 train
shards, 2 validation shards; 1,437 train / 360 validation images). Rerunning with complete output
does nothing; a data set made before the converter recorded the validation images' sizes gets them
(its validation shards are rewritten, the training shards kept).
"""

from __future__ import annotations

import argparse
import os
import sys

from vitlarge import command
from vitlarge.data.manifest import ASPECT_ORDER, MANIFEST_NAME, Manifest, load_manifest
from vitlarge.errors import UserError
from vitlarge.fileio import open_new, write_atomic

from . import imagenet_to_tfrecord

IMAGE_SIZE = 32
NUM_TRAIN, NUM_VAL = 1437, 360


def write_digit_jpegs(src: str) -> None:
    """Write the ImageFolder tree (skipped when a previous run finished it)."""
    done = os.path.join(src, ".complete")
    if os.path.exists(done):
        return
    # lazy: numpy, PIL and scikit-learn only where the tree is not written yet (a demo run finds it written)
    import numpy as np
    from PIL import Image  # lazy: as above
    from sklearn.datasets import load_digits  # lazy: as above
    from sklearn.model_selection import train_test_split  # lazy: as above

    digits = load_digits()
    idx = np.arange(len(digits.target))
    train_idx, val_idx = train_test_split(idx, test_size=0.2, stratify=digits.target, random_state=0)
    for split, ids in (("train", train_idx), ("val", val_idx)):
        for i in sorted(ids):
            d = os.path.join(src, split, str(digits.target[i]))
            os.makedirs(d, exist_ok=True)
            pixels = (digits.images[i] * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)  # values are 0..16
            im = Image.fromarray(pixels, "L").resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR).convert("RGB")
            with open_new(os.path.join(d, f"digit_{i:04d}.jpg")) as f:  # a planted link is replaced, not followed
                im.save(f, "JPEG", quality=95)
    write_atomic(done, "ok\n", root=src)


def make_demo_dataset(out: str, *, workers: int = 0, progress: bool = False) -> Manifest:
    """Build (or find complete) the digits data set in ``out``; return its manifest."""
    try:
        m = load_manifest(out)
        counts = (m.num_examples("train"), m.num_examples("validation"))
        if counts == (NUM_TRAIN, NUM_VAL) and m.order.get("validation") == ASPECT_ORDER:
            return m
    except UserError:
        pass
    try:
        os.makedirs(out, exist_ok=True)
        write_digit_jpegs(os.path.join(out, "src"))
    except OSError as e:
        raise UserError(
            f"{e.filename or out}: cannot write the demo data set ({e.strerror}); choose a writable OUT"
        ) from None
    return imagenet_to_tfrecord.convert(
        os.path.join(out, "src"), out, train_shards=4, val_shards=2, workers=workers, progress=progress
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command("data_tools.make_demo_dataset"), description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    a = p.parse_args(argv)

    def work() -> None:
        m = make_demo_dataset(a.out, progress=True)
        print(
            f"{os.path.join(a.out, MANIFEST_NAME)}: {m.num_examples('train')} train, "
            f"{m.num_examples('validation')} validation images, {m.num_classes} classes"
        )

    return imagenet_to_tfrecord.run_cli(work)  # Ctrl-C: one line, and the rerun resumes


if __name__ == "__main__":
    sys.exit(main())
