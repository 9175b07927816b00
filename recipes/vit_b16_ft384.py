"""ViT-B/16 fine-tuned at 384 px from the 32K pretraining run's export (high-resolution fine-tuning).

    colossalai run --nproc_per_node 4 train.py --config recipes/vit_b16.py --data /data/imagenet-tfrecord
    colossalai run --nproc_per_node 4 train.py --config recipes/vit_b16_ft384.py --data /data/imagenet-tfrecord

``model.init_from`` loads runs/vit_b16/model (weights only) and resamples the position embedding
from 14x14 to 24x24 tokens (vitlarge/checkpoint/init_from.py); the classifier is kept (same 1000 classes).
Hyper-parameters, after the published high-resolution fine-tunes:

* NVIDIA's VOLO training (github.com/NVIDIA/DeepLearningExamples, and Yuan et al. 2021, "VOLO"): fine-tune
  224 -> 384/448/512 from the pretrained weights with a small batch, lr 2.3e-5, weight decay 1e-8,
  5 warmup epochs, 30 epochs.
* DeiT (Touvron et al. 2021, github.com/facebookresearch/deit README, "fine-tuning at 384"): AdamW,
  lr 5e-6 per 512 images, weight decay 1e-8, 30 epochs, evaluation at crop_pct 1.0 for 384 px.
* Touvron et al. 2019, "Fixing the train-test resolution discrepancy" (FixRes): fine-tuning at the test
  resolution recovers the train/test apparent-object-size gap; gentle crops at that stage.

So: AdamW (no LAMB: the batch is small), global batch 512 = 32 x 4 x 4 on 4x A100 (gradient
checkpointing off: 577 tokens x 32 fits 80 GB), lr 2.3e-5 (VOLO) with 5 warmup epochs and cosine decay
to 0, weight decay 1e-8, 30 epochs, light Mixup as in the pretraining, crops (0.25, 1), and
``val_crop_pct`` 1.0 (DeiT's 384 px evaluation; VOLO's 1.15 > 1 is not a crop vitlarge's validation
pipeline makes). Not run at ImageNet scale here; the demo analogue is recipes/demo_digits_ft24.py.
"""

from vitlarge.recipes.vit_b16 import config as base


def config():
    c = base()
    c.model.init_from = "runs/vit_b16/model"
    c.model.drop_path_rate = 0.1
    c.data.image_size = 384
    c.data.crop_scale = (0.25, 1.0)
    c.data.val_crop_pct = 1.0
    c.optim.name = "adamw"
    c.optim.lr = 2.3e-5
    c.optim.weight_decay = 1e-8
    c.optim.eps = 1e-8
    c.schedule.warmup_epochs = 5
    c.schedule.decay = "cosine"
    c.train.global_batch = 512
    c.train.micro_batch = 32
    c.train.epochs = 30
    c.train.eval_every_epochs = 1
    c.train.checkpoint_every_steps = 1000
    c.workdir = "runs/vit_b16_ft384"
    return c
