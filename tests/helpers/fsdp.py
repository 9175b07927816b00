"""train.plugin=fsdp on the demo recipe, built as train.py builds it (`vitlarge.train.assemble.build`), and its batches."""

from __future__ import annotations

import torch

from tests.helpers import ROOT

RECIPE = ROOT / "recipes" / "demo_digits.py"


def recipe(precision: str, checkpointing: bool = False, **train):
    from vitlarge.config.load import load_recipe

    cfg = load_recipe(RECIPE)
    cfg.train.activation_checkpointing = "full" if checkpointing else "off"
    cfg.train.plugin, cfg.train.precision, cfg.train.global_batch = "fsdp", precision, 32
    cfg.augment.mixup_alpha = 0.0  # any batch size
    for k, v in train.items():
        setattr(cfg.train, k, v)
    return cfg


def built(precision: str, world: int = 1, checkpointing: bool = False, **train):
    from vitlarge.plan.plan import make_plan
    from vitlarge.train.assemble import build
    from vitlarge.train.settings import resolve_settings

    cfg = recipe(precision, checkpointing, **train)
    return build(cfg, make_plan(cfg, world, 1437), resolve_settings(cfg, "cpu"))


def batches(n: int = 16):
    g = torch.Generator().manual_seed(0)
    return lambda: (torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g))
