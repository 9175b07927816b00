"""ViT-H/14 on ImageNet-1K at a 32K batch: the path to much larger ViTs.

    colossalai run --nproc_per_node 8 train.py --config recipes/vit_h14.py --data /data/imagenet-tfrecord

Hardware: 8x A100 80GB or more. 632M parameters: LAMB states are sharded over the data-parallel ranks
(ZeRO stage 1, CUDA only), activations are recomputed, and bf16 replaces fp16 (no loss scaling;
timm keeps LayerNorm in fp32 under autocast). Expected time and accuracy: not measured; by FLOPs
about 12x the B/16 run.
"""

from recipes.vit_b16 import config as base


def config():
    c = base()
    c.model.name = "vit_huge_patch14_224"
    c.model.grad_checkpointing = True
    c.train.micro_batch = 64
    c.train.precision = "bf16"
    c.train.plugin = "zero"
    c.workdir = "runs/vit_h14"
    return c
