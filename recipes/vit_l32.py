"""ViT-L/32 on ImageNet-1K at a 32K batch.

    colossalai run --nproc_per_node 4 train.py --config recipes/vit_l32.py --data /data/imagenet-tfrecord

Hardware: 4x A100 80GB, 256 images per GPU. Expected: 37.83 h for 300 epochs on 4x A100
(Colossal-AI's report); accuracy not published by them.
"""

from vitlarge.recipes.vit_b16 import config as base


def config():
    c = base()
    c.model.name = "vit_large_patch32_224"
    c.workdir = "runs/vit_l32"
    return c
