"""ViT-H/14 on ImageNet-1K at a 32K batch: the path to much larger ViTs.

    colossalai run --nproc_per_node 8 train.py --config recipes/vit_h14.py --data /data/imagenet-tfrecord

Hardware: 8x A100 80GB or more. 632M parameters: weights, gradients and LAMB states are sharded over
the data-parallel ranks (``fsdp``: one unit per block, tested on CPU with gloo), activations are
recomputed per block, and bf16 replaces fp16 (no loss scaling; fp32 masters, LAMB states, gradient
reduction and LayerNorm). Expected time and accuracy: not measured; by FLOPs about 12x the B/16 run.

Recompute: ``train.activation_checkpointing=full``. To measure: ``train.activation_checkpointing=selective`` on the
command line (the dry run plans it) at micro-batch 64 (full fit 1,024 in 68.3 GiB on an H200); the recipe takes it when the GPU kit shows it fits an
80 GB GPU and is faster. Compiled (``train.compile`` auto on CUDA), each block is compiled before FSDP shards it
(``train.compile_scope`` auto under fsdp).
"""

from vitlarge.recipes.vit_b16 import config as base


def config():
    c = base()
    c.model.name = "vit_huge_patch14_224"
    c.train.activation_checkpointing = "full"
    c.train.micro_batch = 64
    c.train.precision = "bf16"
    c.train.plugin = "fsdp"
    # 64 micro-steps per step: sum them in fp32 gradient shards (1/W of the memory, docs/FSDP.md);
    # what train.fsdp_accumulation=auto picks under bf16 anyway, stated here as the recipe's choice.
    c.train.fsdp_accumulation = "reduce_scatter"
    c.workdir = "runs/vit_h14"
    return c
