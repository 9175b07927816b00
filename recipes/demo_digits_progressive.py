"""Demo with progressive resolution: the digits at 8 px, then 12 px, then the demo's 16 px at the end.

    colossalai run --nproc_per_node 2 train.py --config recipes/demo_digits_progressive.py

Same model, data, batch, optimizer and 60 epochs as recipes/demo_digits.py; only the resolution
changes (fast.ai/DIUx imagenet18 style, vitlarge/phases.py): 4x fewer tokens per image for the first
half, 16/9x fewer until epoch 48, full size for the last 12 epochs, whose crops are gentler
(crop_scale 0.8-1, as fast.ai's last phase). The position embedding stays on the 16 px (4x4) grid
and is resampled to 2x2 and 3x3 on the fly. Measured against demo_digits.py: docs/PROGRESSIVE.md.
"""

from recipes.demo_digits import config as base


def config():
    c = base()
    c.train.phases = [
        {"epoch": 0, "image_size": 8},
        {"epoch": 30, "image_size": 12},
        {"epoch": 48, "image_size": 16, "crop_scale": (0.8, 1.0)},
    ]
    c.workdir = "runs/demo_digits_progressive"
    return c
