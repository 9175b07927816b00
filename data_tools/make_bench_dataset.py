"""ImageNet-like JPEGs for benchmarks, made from scikit-learn's bundled sample photographs.

    python -m data_tools.make_bench_dataset /tmp/bench --num-images 2000 --classes 10

Each image is a random crop (30-100% of a side) of one of the two 640x427 sample photos, flipped
at random, colour- and brightness-shifted, resized to an ImageNet-typical size (500x375,
375x500, 500x333, ... jittered), given mild sensor-like noise (standard deviation uniform in ``--noise``, default 4-8) and saved as JPEG
(``--quality``, default 92): about 60 KB on average at the defaults; ``--quality 95 --noise 8,12`` gives
about ImageNet's ~110 KB. Layout ``OUT/{train,val}/<class>/*.JPEG``
(class names ``c0000``...), with
``--val-fraction`` of the images in val. ``OUT/bench.json`` records the parameters; a rerun
with the same parameters does nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from vitlarge import command
from vitlarge.errors import UserError, cli_main
from vitlarge.fileio import open_new, write_atomic

SIZES = ((500, 375), (375, 500), (500, 333), (333, 500), (500, 500), (400, 300), (640, 480))


def make_bench_dataset(
    out: str,
    *,
    num_images: int,
    classes: int,
    val_fraction: float = 0.1,
    seed: int = 0,
    quality: int = 92,
    noise: tuple[float, float] = (4.0, 8.0),
) -> dict:
    from PIL import Image  # lazy: PIL and scikit-learn only where images are written
    from sklearn.datasets import load_sample_images  # lazy: as above

    if num_images < 1 or classes < 1 or not 0 <= val_fraction < 1:
        raise UserError("need --num-images >= 1, --classes >= 1 and 0 <= --val-fraction < 1")
    if not 1 <= quality <= 100 or not 0 <= noise[0] <= noise[1]:
        raise UserError(
            f"need 1 <= --quality <= 100 and --noise LOW,HIGH with 0 <= LOW <= HIGH, got {quality}, {noise}"
        )
    params = {"num_images": num_images, "classes": classes, "val_fraction": val_fraction, "seed": seed}
    if (quality, tuple(noise)) != (92, (4.0, 8.0)):  # the defaults' bench.json stays as it was
        params |= {"quality": quality, "noise": list(noise)}
    meta = os.path.join(out, "bench.json")
    try:
        with open(meta) as f:
            if json.load(f) == params:
                return params
    except (OSError, ValueError):
        pass
    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    num_val = int(round(num_images * val_fraction))
    try:
        for i in range(num_images):
            split = "val" if i < num_val else "train"
            d = os.path.join(out, split, f"c{i % classes:04d}")
            os.makedirs(d, exist_ok=True)
            p = photos[int(rng.integers(len(photos)))]
            h = int(p.shape[0] * rng.uniform(0.3, 1.0))
            w = int(p.shape[1] * rng.uniform(0.3, 1.0))
            y, x = int(rng.integers(0, p.shape[0] - h + 1)), int(rng.integers(0, p.shape[1] - w + 1))
            crop = p[y : y + h, x : x + w].astype(np.float32)
            if rng.random() < 0.5:
                crop = crop[:, ::-1]
            crop = crop * rng.uniform(0.75, 1.25, size=3) + rng.uniform(-25, 25)
            tw, th = SIZES[int(rng.integers(len(SIZES)))]
            jitter = rng.uniform(0.85, 1.0)
            im = Image.fromarray(crop.clip(0, 255).astype(np.uint8)).resize(
                (int(tw * jitter), int(th * jitter)), Image.BILINEAR
            )
            # Sensor-like noise gives the JPEG the entropy (size, decode cost) of a real photo.
            pixels = np.asarray(im, dtype=np.float32) + rng.normal(0, rng.uniform(*noise), (im.height, im.width, 3))
            with open_new(os.path.join(d, f"img_{i:07d}.JPEG")) as f:  # a planted link is replaced, not followed
                Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(f, "JPEG", quality=quality)
        write_atomic(meta, json.dumps(params), root=out)
    except OSError as e:
        raise UserError(f"{e.filename or out}: cannot write ({e.strerror}); choose a writable OUT") from None
    return params


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command("data_tools.make_bench_dataset"), description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--num-images", type=int, default=2000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quality", type=int, default=92, help="JPEG quality (default 92)")
    p.add_argument(
        "--noise",
        type=lambda v: tuple(float(x) for x in v.split(",")),
        default=(4.0, 8.0),
        metavar="LOW,HIGH",
        help="range of the noise's standard deviation (default 4,8)",
    )
    a = p.parse_args(argv)
    return cli_main(
        lambda: make_bench_dataset(
            a.out,
            num_images=a.num_images,
            classes=a.classes,
            val_fraction=a.val_fraction,
            seed=a.seed,
            quality=a.quality,
            noise=a.noise,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
