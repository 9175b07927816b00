"""DeiT III ViT-B/16 pretraining on ImageNet-1K at 192 px (Touvron, Cord, Jégou, "DeiT III: Revenge of the ViT", 2022).

    colossalai run --nproc_per_node 8 train.py --config recipes/deit3_b16.py --data /data/imagenet-tfrecord

The paper's recipe (facebookresearch/deit, README_revenge.md): LAMB, global batch 2048 (256 x 8 GPUs),
lr 3e-3 without batch scaling, weight decay 0.05, cosine with 5 warmup epochs, 800 epochs at 192 px,
Mixup 0.8 and CutMix 1.0, drop path 0.2, no label smoothing, binary cross-entropy on targets binarised
above 0 (DeiT's ``targets.gt(0.0)``), repeated augmentation (3), 3-Augment with colour jitter 0.3 and the
simple random crop, no random erasing, LayerScale (timm's ``deit3_*`` models). Then 20 epochs of
fine-tuning at 224 px: recipes/deit3_b16_ft224.py.

Published (not reproduced here: no ImageNet run has been made with vitlarge): 83.8% top-1 for ViT-B/16
after the 224 px fine-tune (the paper's table for ImageNet-1K only). vitlarge gives the pieces timm's
versions of them (tests/unit/data/test_deit_augment.py, tests/unit/train/test_engine.py, the sampler and
EMA tests); what a full run reaches on this code is open.
"""

from vitlarge.config.schema import Config


def config() -> Config:
    c = Config()
    c.model.name = "deit3_base_patch16_224"  # LayerScale; built at data.image_size, position embedding resampled
    c.model.drop_path_rate = 0.2
    c.data.path = "/data/imagenet-tfrecord"
    c.data.num_classes = 1000
    c.data.image_size = 192
    c.data.crop = "src"
    c.data.three_augment = True
    c.data.color_jitter = 0.3
    c.data.repeats = 3
    c.augment.mixup_alpha = 0.8
    c.augment.cutmix_alpha = 1.0
    c.augment.label_smoothing = 0.0
    c.augment.loss = "bce"
    c.augment.bce_target_thresh = 0.0
    c.augment.random_erase_prob = 0.0
    c.optim.name = "lamb"
    c.optim.lr = 3e-3
    c.optim.weight_decay = 0.05
    c.optim.clip_grad_norm = 0.0  # DeiT III does not clip
    c.schedule.warmup_epochs = 5
    c.schedule.decay = "cosine"
    c.train.global_batch = 2048
    c.train.micro_batch = 256
    c.train.epochs = 800
    c.train.precision = "auto"
    c.train.eval_every_epochs = 20
    c.train.checkpoint_every_steps = 1000  # ~1.6 epochs
    c.workdir = "runs/deit3_b16"
    return c
