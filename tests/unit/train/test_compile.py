"""train.compile (vitlarge/train/assemble.py): the model's forward through torch.compile, in place, before the Booster.

Here, in process: ``auto`` resolved by device with the line that says why, and the recompile limit that
fits a run's graphs. The parameter names of a compiled model in checkpoints, the export and
model.init_from are in tests/unit/checkpoint/test_export.py; whole compiled runs (losses that follow
eager's, graphs across phases, an exact resume, DDP) in tests/e2e/test_compile_runs.py.
"""

from __future__ import annotations

import torch

from tests.helpers import ROOT
from vitlarge.config.load import load_recipe
from vitlarge.plan.plan import make_plan
from vitlarge.train.assemble import recompile_limit
from vitlarge.train.settings import compile_choice, resolve_settings

DEMO = ROOT / "recipes" / "demo_digits.py"
TINY = "model.kwargs={'patch_size': 4, 'embed_dim': 32, 'depth': 1, 'num_heads': 2}"

torch.set_num_threads(1)


def tiny_cfg(**train):
    c = load_recipe(DEMO)
    c.model.kwargs = dict(patch_size=4, embed_dim=32, depth=1, num_heads=2)
    c.train.precision = "fp32"
    c.augment.mixup_alpha = 0.0
    for k, v in train.items():
        setattr(c.train, k, v)
    return c


def test_auto_is_on_with_cuda_off_on_cpu_and_the_log_line_says_why():
    on, why = compile_choice("auto", torch.device("cpu"))
    assert not on and why.startswith("compile auto -> off: CPU: ")
    on, why = compile_choice("auto", torch.device("cuda"))
    assert on and why.startswith("compile auto -> on: CUDA")
    assert compile_choice("on", torch.device("cpu")) == (True, "compile on: set by the recipe")
    c = tiny_cfg(compile="auto")
    settings = resolve_settings(c, "cpu")
    assert c.train.compile == "auto" and settings.config(c).train.compile == "off"  # the recipe's object untouched


def test_recompile_limit_fits_three_graphs_per_phase():
    c = load_recipe(ROOT / "recipes" / "demo_digits_progressive.py")
    assert recompile_limit(make_plan(c, 2, 1437)) == 3 * 3 + 2
    assert recompile_limit(make_plan(load_recipe(DEMO), 2, 1437)) == 3 + 2
