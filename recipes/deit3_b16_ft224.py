"""DeiT III ViT-B/16: the 20-epoch fine-tune at 224 px of recipes/deit3_b16.py's export.

    colossalai run --nproc_per_node 8 train.py --config recipes/deit3_b16_ft224.py --data /data/imagenet-tfrecord \\
        model.init_from=runs/deit3_b16/model

From facebookresearch/deit's README_revenge.md: AdamW, lr 1e-5 without batch scaling, weight decay 0.1,
global batch 512 (64 x 8), cosine with 5 warmup epochs, 20 epochs at 224 px, RandAugment
``rand-m9-mstd0.5-inc1``, label smoothing 0.1, Mixup 0.8 and CutMix 1.0, drop path 0.2, cross-entropy,
no repeated augmentation, no random erasing. DeiT's ``--min-lr`` (1e-5) equals the lr, so after the
warmup the lr is constant (``schedule.min_lr_ratio=1.0``). The position embedding is resampled from 192 to 224 px
(`vitlarge.checkpoint.init_from`). Published: 83.8% top-1 (ViT-B/16, ImageNet-1K only); not reproduced here.
"""

from vitlarge.config.schema import Config
from vitlarge.recipes.deit3_b16 import config as pretraining


def config() -> Config:
    c = pretraining()
    c.model.init_from = "runs/deit3_b16/model"
    c.data.image_size = 224
    c.data.three_augment = False
    c.data.color_jitter = 0.0
    c.data.repeats = 1
    c.data.randaugment = "rand-m9-mstd0.5-inc1"
    c.augment.label_smoothing = 0.1
    c.augment.loss = "ce"
    c.augment.bce_target_thresh = None
    c.optim.clip_grad_norm = 0.0  # DeiT's AdamW fine-tune does not clip
    c.optim.name = "adamw"
    c.optim.lr = 1e-5
    # DeiT's --min-lr default, 1e-5, equals this lr: after the warmup its cosine stays at 1e-5.
    c.schedule.min_lr_ratio = 1.0
    c.optim.weight_decay = 0.1
    c.train.global_batch = 512
    c.train.micro_batch = 64
    c.train.epochs = 20
    c.train.eval_every_epochs = 1
    c.train.checkpoint_every_steps = 500
    c.workdir = "runs/deit3_b16_ft224"
    return c
