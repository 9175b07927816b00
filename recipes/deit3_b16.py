"""DeiT III ViT-B/16 pretraining on ImageNet-1K at 192 px (Touvron, Cord, Jégou, "DeiT III: Revenge of the ViT", 2022).

    colossalai run --nproc_per_node 8 train.py --config recipes/deit3_b16.py --data /data/imagenet-tfrecord

The paper's recipe (facebookresearch/deit, README_revenge.md): LAMB, global batch 2048 (256 x 8 GPUs),
lr 3e-3 without batch scaling, weight decay 0.05, cosine with 5 warmup epochs, 800 epochs at 192 px,
Mixup 0.8 and CutMix 1.0, drop path 0.2, no label smoothing, binary cross-entropy on targets binarised
above 0 (DeiT's ``targets.gt(0.0)``), repeated augmentation (3), 3-Augment with colour jitter 0.3 after
the random-resized crop (the simple random crop, ``data.crop="src"``, is DeiT III's ImageNet-21k
recipe), no random erasing, LayerScale initialised at 1e-4 (DeiT's ``models_v2.py``; timm's ``deit3_*``
default of 1e-6 only matters for loading the released weights), LAMB's global-norm clipping at 1.0
(DeiT runs apex's FusedLAMB, whose ``max_grad_norm`` is 1.0; vitlarge's LAMB clips through
``optim.clip_grad_norm``). Then 20 epochs of fine-tuning at 224 px: recipes/deit3_b16_ft224.py.

As DeiT's code: drop path 0.2 in every block (``model.drop_path_schedule="uniform"``; timm spreads it
from 0), bicubic training crops (``data.train_interpolation``), the cosine ending at DeiT's ``min_lr`` 1e-5
(``schedule.min_lr_ratio`` = 1e-5 / 3e-3). Known differences: the warmup starts at 0 (DeiT: 1e-6, a
3000th of the peak); the random-resized crop's bicubic resize is not antialiased (PIL's is; vitlarge leaves
it off for the CPU pipeline's speed, docs/DATA.md): a difference wherever a crop is shrunk, as most crops of
ImageNet's ~400 px images are at 192 px. Under fp16 (GPUs without bf16),
BCE's per-class mean makes gradients 1/1000 of cross-entropy's, and some flush to zero: DeiT III's own fp16
(timm's NativeScaler, a GradScaler at 2**16 growing every 2000 steps) is vitlarge's default loss scaling, so
this is the paper's setting; bf16 avoids it (``train.precision=auto`` gives it on Ampere and later).

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
    c.model.drop_path_schedule = "uniform"  # 0.2 in every block, as DeiT's models_v2.py (timm: 0 to 0.2)
    c.model.kwargs = {"init_values": 1e-4}  # LayerScale's initial gamma, as DeiT III trained it
    c.data.path = "/data/imagenet-tfrecord"
    c.data.num_classes = 1000
    c.data.image_size = 192
    c.data.crop = "rrc"
    c.data.crop_scale = (0.08, 1.0)
    c.data.train_interpolation = "bicubic"  # DeiT's --train-interpolation default
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
    c.optim.clip_grad_norm = 1.0  # FusedLAMB's max_grad_norm in DeiT III
    c.schedule.warmup_epochs = 5
    c.schedule.decay = "cosine"
    c.schedule.min_lr_ratio = 1e-5 / 3e-3  # DeiT's --min-lr 1e-5
    c.train.global_batch = 2048
    c.train.micro_batch = 256
    c.train.epochs = 800
    c.train.precision = "auto"
    c.train.eval_every_epochs = 20
    c.train.checkpoint_every_steps = 1000  # ~1.6 epochs
    c.workdir = "runs/deit3_b16"
    return c
