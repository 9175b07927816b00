"""The demo recipe's 0.46M-parameter ViT with the project's LAMB and a CPU loss scaler, trained a step or two.

Shared by the checkpoint, export and resume tests: a model whose weights, optimizer state and loss
scale all differ from a fresh build's, so a save/load round trip that drops any of them fails.
"""

import torch

from vitlarge.config.schema import OptimConfig
from vitlarge.model.vit import build_model
from vitlarge.optim.lamb import build_optimizer


def make(cfg, seed=0):
    """A model, LAMB and a CPU loss scaler that grows every step (so its scale changes)."""
    torch.manual_seed(seed)
    model = build_model(cfg)
    opt = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    return model, opt, scaler


def train_step(model, opt, scaler, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
    model.train()  # dropout draws from the global torch RNG, so a resumed run must restore it
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def trained(cfg, steps=2):
    model, opt, scaler = make(cfg)
    for s in range(steps):
        train_step(model, opt, scaler, s)
    return model, opt, scaler
