"""ViT-B/32 on ImageNet-1K at a 32K batch: the B/16 recipe with 32-pixel patches.

    colossalai run --nproc_per_node 4 train.py --config recipes/vit_b32.py --data /data/imagenet-tfrecord

Hardware: 4x A100. Expected: 14.58 h for 300 epochs on 4x A100 (Colossal-AI's report); accuracy
not published by them (ViT-B/32 from scratch on ImageNet-1K is typically 3-5 points below B/16).
"""

from vitlarge.recipes.vit_b16 import config as base


def config():
    c = base()
    c.model.name = "vit_base_patch32_224"
    c.workdir = "runs/vit_b32"
    return c
