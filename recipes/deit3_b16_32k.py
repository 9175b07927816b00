"""DeiT III ViT-B/16 pretraining at a 32K global batch: recipes/deit3_b16.py on vitlarge's large-batch machinery.

    colossalai run --nproc_per_node 8 train.py --config recipes/deit3_b16_32k.py --data /data/imagenet-tfrecord
    srun python train.py --config recipes/deit3_b16_32k.py ...   # 128 GPUs: 256 x 1 x 128

The batch grows 16x (2048 -> 32768). The lr follows the square-root rule that LAMB was introduced with
(You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes", ICLR 2020: lr
scaled by sqrt(batch ratio)): 3e-3 x sqrt(16) = 1.2e-2, close to Colossal-AI's 1.8e-2 for ViT-B/16 at
32K (recipes/vit_b16.py). The warmup grows by the same factor, 5 -> 20 epochs: at 32K an epoch is 39
steps, and 5 epochs (195 steps) is too short for LAMB's trust ratios to settle (Colossal-AI warmed up
for half the run). Everything else (clipping at 1.0 included) is recipes/deit3_b16.py's.
Not run: what this reaches is open; the published 83.8% is for the 2048 batch and its fine-tune.
"""

from vitlarge.config.schema import Config
from vitlarge.recipes.deit3_b16 import config as deit3


def config() -> Config:
    c = deit3()
    c.train.global_batch = 32768
    c.train.micro_batch = 256
    c.optim.lr = 1.2e-2
    c.schedule.min_lr_ratio = 1e-5 / 1.2e-2  # the cosine still ends at DeiT's min_lr 1e-5
    c.schedule.warmup_epochs = 20
    c.train.checkpoint_every_steps = 200
    c.workdir = "runs/deit3_b16_32k"
    return c
