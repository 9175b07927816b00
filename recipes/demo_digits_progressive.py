"""Demo with progressive resolution: the digits at 8 px, then 12 px, then the demo's 16 px from epoch 36.

    colossalai run --nproc_per_node 2 train.py --config recipes/demo_digits_progressive.py

Same model, data, global batch 128, optimizer, lr schedule and 60 epochs as recipes/demo_digits.py;
the resolution changes in phases (fast.ai/DIUx imagenet18 style, vitlarge/plan/phases.py): 8 px (2x2
tokens) for epochs 0-20, 12 px (3x3) for 20-36, 16 px (4x4) for the last 24 epochs, with gentler
crops there (crop_scale 0.8-1, as fast.ai's last phase). Low-resolution steps are cheap, so their
per-step overhead dominates: those phases take bigger micro batches (64 and 32 images, accumulation
1 and 2 instead of 4). The position embedding stays on the 4x4 grid and is resampled on the fly.
Measured against demo_digits.py (2 CPU processes): docs/PROGRESSIVE.md.
"""

from vitlarge.recipes.demo_digits import config as base


def config():
    c = base()
    c.train.phases = [
        {"epoch": 0, "image_size": 8, "micro_batch": 64},
        {"epoch": 20, "image_size": 12, "micro_batch": 32},
        {"epoch": 36, "image_size": 16, "micro_batch": 16, "crop_scale": (0.8, 1.0)},
    ]
    c.workdir = "runs/demo_digits_progressive"
    return c
