"""Demo fine-tune: the digits demo's export (16 px) fine-tuned at 24 px for 5 epochs.

    colossalai run --nproc_per_node 2 train.py --config recipes/demo_digits.py
    colossalai run --nproc_per_node 2 train.py --config recipes/demo_digits_ft24.py

``model.init_from`` loads the export's weights and resamples the position embedding from the 4x4
to the 6x6 token grid (vitlarge/checkpoint/init_from.py); the classifier is kept (same 10 classes). The
hyper-parameters follow the high-resolution fine-tunes of recipes/vit_b16_ft384.py at toy scale: a
small lr (a tenth of the demo's) with a short warmup and cosine decay, tiny weight decay, no Mixup,
gentle crops; the optimizer stays the demo's LAMB. Evaluated
every epoch, at 24 px. Measured: docs/PROGRESSIVE.md. For other classes than the source's (a new classifier):
recipes/demo_transfer.py.
"""

from vitlarge.recipes.demo_digits import config as base


def config():
    c = base()
    c.model.init_from = "runs/demo_digits/model"
    c.data.image_size = 24
    c.data.crop_scale = (0.8, 1.0)
    c.augment.mixup_alpha = 0.0
    c.optim.lr = 2e-3
    c.optim.weight_decay = 1e-8
    c.schedule.warmup_epochs = 1
    c.schedule.decay = "cosine"
    c.train.epochs = 5
    c.train.eval_every_epochs = 1
    c.train.checkpoint_every_steps = 0
    c.train.log_every_steps = 11
    c.workdir = "runs/demo_digits_ft24"
    return c
