"""ViT-L/16 on ImageNet-1K at a 32K batch: 4x the tokens of L/32, so half the micro-batch.

    colossalai run --nproc_per_node 8 train.py --config recipes/vit_l16.py --data /data/imagenet-tfrecord

Hardware: 8x A100 80GB (128 images per GPU, 32 accumulation steps); activation checkpointing keeps
the micro-batch at 128. Expected time and accuracy: not measured by Colossal-AI nor by us; by FLOPs,
about 3.5x the B/16 run (~ 140 h on 8x A100 at B/16's utilisation).
"""

from vitlarge.recipes.vit_b16 import config as base


def config():
    c = base()
    c.model.name = "vit_large_patch16_224"
    c.model.grad_checkpointing = True
    c.train.micro_batch = 128
    c.workdir = "runs/vit_l16"
    return c
