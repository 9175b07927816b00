"""ViT-L/16 on ImageNet-1K at a 32K batch: 4x the tokens of L/32, so half the micro-batch.

    colossalai run --nproc_per_node 8 train.py --config recipes/vit_l16.py --data /data/imagenet-tfrecord

Hardware: 8x A100 80GB (128 images per GPU, 32 accumulation steps); activation checkpointing keeps
the micro-batch at 128. Expected time and accuracy: not measured by Colossal-AI nor by us; by FLOPs,
about 3.5x the B/16 run (~ 140 h on 8x A100 at B/16's utilisation).

Recompute: ``train.activation_checkpointing=full`` (one more forward of every block per step). To measure:
``train.activation_checkpointing=selective`` on the command line (matmul outputs kept, no second GEMM; the dry run
plans it), which at micro-batch 128
likely fits an 80 GB GPU (full checkpointing fit micro-batch 1,024 in 34.8 GiB on an H200); the recipe takes
it when the GPU kit shows it fits and is faster.
"""

from vitlarge.recipes.vit_b16 import config as base


def config():
    c = base()
    c.model.name = "vit_large_patch16_224"
    c.train.activation_checkpointing = "full"
    c.train.micro_batch = 128
    c.workdir = "runs/vit_l16"
    return c
