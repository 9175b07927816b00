"""train.activation_checkpointing (vitlarge/model/recompute.py): off, full and selective train the same numbers,
and keep less for backward in that order.

The model is the demo's ViT (2 of its 4 blocks) at 16 px with every dropout and stochastic depth on, so the recompute
must replay the random draws; fp32 on CPU, one process. Under FSDP at 3 ranks: tests/e2e/test_fsdp.py; compiled
per block under FSDP: tests/e2e/test_compile_runs.py.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.harness.activations import held_after_forward
from tests.helpers import ROOT
from vitlarge.config.load import load_recipe
from vitlarge.config.schema import OptimConfig
from vitlarge.errors import UserError
from vitlarge.model import recompute
from vitlarge.model.vit import build_model
from vitlarge.optim.lamb import build_optimizer

torch.set_num_threads(1)

TOLERANCE = 1e-6
"""Largest |loss - off's loss| and parameter difference allowed after 3 LAMB steps, fp32. The recompute runs the
same kernels on the same inputs, so on one machine they are equal bit for bit (measured: 0); the bound leaves
room for a kernel that picks its reduction order per call."""


def cfg(mode: str):
    c = load_recipe(ROOT / "recipes" / "demo_digits.py")
    c.model.kwargs = {**c.model.kwargs, "depth": 2}  # two blocks show what four do, in half the time
    c.model.attn_drop_rate = c.model.proj_drop_rate = c.model.drop_path_rate = 0.1
    c.train.activation_checkpointing = mode
    return c


def batch(n: int = 8):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


def train(mode: str, steps: int = 3) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = build_model(cfg(mode))
    opt = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1))
    x, y = batch()
    losses = []
    torch.manual_seed(1)  # the dropout masks: the same draws in every mode
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_full_and_selective_train_offs_losses_and_weights():
    off_losses, off_weights = train("off")
    for mode in ("full", "selective"):
        losses, weights = train(mode)
        assert max(abs(a - b) for a, b in zip(losses, off_losses)) <= TOLERANCE, (mode, losses, off_losses)
        assert weights.keys() == off_weights.keys()  # the state dict is the plain model's
        worst = max((weights[k] - off_weights[k]).abs().max().item() for k in weights)
        assert worst <= TOLERANCE, (mode, worst)
    assert off_losses[0] != off_losses[-1]  # it trained: equality means something


def test_selective_keeps_about_half_of_offs_activations_and_full_the_least():
    x, y = batch(16)
    held = {}
    for mode in recompute.MODES:
        torch.manual_seed(0)
        held[mode] = held_after_forward(build_model(cfg(mode)), x, y)
    assert held["full"] < held["selective"] < 0.75 * held["off"], held


def test_the_modes_keep_the_blocks_classes_names_and_state_dict():
    plain = build_model(cfg("off"))
    full, selective = build_model(cfg("full")), build_model(cfg("selective"))
    assert full.grad_checkpointing and not selective.grad_checkpointing
    for a, b in zip(plain.blocks, selective.blocks):
        assert isinstance(b, type(a)) and type(b).__name__ == type(a).__name__ and type(b) is not type(a)
    assert list(selective.state_dict()) == list(full.state_dict()) == list(plain.state_dict())


def test_selective_needs_transformer_blocks():
    with pytest.raises(UserError, match="^train.activation_checkpointing=selective .* Linear has no timm Block"):
        recompute.apply(torch.nn.Linear(2, 2), "selective")
