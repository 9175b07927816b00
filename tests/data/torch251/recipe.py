from recipes.demo_digits import config as base


def config():
    c = base()
    c.model.kwargs = dict(patch_size=4, embed_dim=24, depth=2, num_heads=2)
    c.train.epochs = 2
    c.schedule.warmup_epochs = 0.5
    c.train.checkpoint_every_steps = 5
    c.train.keep_checkpoints = 3
    c.train.precision = "fp32"
    c.train.eval_every_epochs = 1
    return c
