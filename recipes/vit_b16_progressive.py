"""ViT-B/16 on ImageNet-1K at a 32K global batch with progressive resolution (fast.ai/DIUx style).

    colossalai run --nproc_per_node 4 train.py --config recipes/vit_b16_progressive.py --data /data/imagenet-tfrecord
    python train.py --config recipes/vit_b16_progressive.py --dry-run      # the phase table and FLOPs

recipes/vit_b16.py with the resolution in three phases: 128 px for the first half (epochs 0-150, the
whole warmup; 64 tokens instead of 196), 176 px for epochs 150-240, the full 224 px for the last 60
epochs. As in fast.ai's imagenet18 schedule, low-resolution phases use gentler random crops
(min_scale 0.35 at 128 px) and the full resolution the standard ones (0.08). The 32K global batch, LAMB,
lr 1.8e-2, its 150-epoch warmup and linear decay are unchanged, so the lr is the same function of the
step as in vit_b16.py. At 128 px the activations of a 256-image micro batch shrink ~3x; the first phase
runs 512 per device (half the accumulation micro-steps).

The position embedding keeps its 14x14 grid and is resampled on the fly (timm ``dynamic_img_size``);
validation runs at each phase's size. ``--dry-run`` (4 devices): 2.2e19 training FLOPs, 54% of
vit_b16.py's 4.04e19 (a 46% saving; docs/PROGRESSIVE.md). Accuracy is not measured at ImageNet scale yet:
DeiT III (Touvron et al., 2022) pretrains ViT-B at 192 px and fine-tunes at 224 without loss, and
fast.ai's schedule reached 93% top-5 in 18 minutes this way; a run of this recipe is what tells.
"""

from vitlarge.recipes.vit_b16 import config as base


def config():
    c = base()
    c.train.phases = [
        {"epoch": 0, "image_size": 128, "micro_batch": 512, "crop_scale": (0.35, 1.0)},
        {"epoch": 150, "image_size": 176, "micro_batch": 256, "crop_scale": (0.25, 1.0)},
        {"epoch": 240, "image_size": 224, "crop_scale": (0.08, 1.0)},
    ]
    c.workdir = "runs/vit_b16_progressive"
    return c
