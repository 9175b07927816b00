"""The demo recipe as unit tests edit it."""

from __future__ import annotations

from tests.helpers import ROOT
from vitlarge.config.load import load_recipe, validate

DEMO = ROOT / "recipes" / "demo_digits.py"
DEMO_TRAIN_EXAMPLES = 1437  # digits training images: 11 steps/epoch at 128, 22 at 64 (the last partial batch dropped)


def demo(phase_list=(), **train):
    """The demo recipe with ``train.phases`` and ``train.<key>`` values set, validated."""
    c = load_recipe(DEMO)
    c.train.phases = list(phase_list)
    for k, v in train.items():
        setattr(c.train, k, v)
    validate(c)
    return c
