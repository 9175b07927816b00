"""The training contenders of the GPU kit (benchmarks/gpu/): vitlarge's engine and a bare PyTorch loop.

Both train the same timm ViT (`vitlarge.model.vit.build_model`, the recipe's dropouts, fused attention
on CUDA) on one synthetic batch already on the device, so the figure is the compute side only:

- ``EngineRun``: what train.py runs per optimizer step, built by `vitlarge.train.assemble.build`
  (autocast, GradScaler for fp16, accumulation micro-steps, global-norm clipping after unscale,
  vitlarge's LAMB with the no-decay groups, the lr schedule), with ``train.compile`` off or on. Its Booster is Colossal-AI's
  (TorchDDPPlugin at world size 1) when Colossal-AI imports, else `PlainBooster`.
- `benchmarks.harness.loop.BareLoop` with `benchmarks.harness.loop.timm_lamb`: what a user writes: autocast, GradScaler, accumulation, ``clip_grad_norm_`` and
  timm's ``Lamb`` over timm's weight-decay groups with the model's no-decay names (the same split as
  vitlarge's); no DDP, no schedule.

Contract: ``step()`` runs one optimizer step (``accum_steps`` forward/backward passes of
``micro_batch`` images) and returns nothing the host must wait for beyond what the loop itself
reads (the engine reads the gradient norm, as in training). ``skipped`` counts the steps that did
not update (non-finite gradients) so far; read it outside timed regions.
"""

from __future__ import annotations

import contextlib

import torch

from benchmarks.harness.loop import build_parts, make_batches
from benchmarks.harness.recipe import bench_config

RECIPES = {"vit_b16": "ViT-B/16", "vit_l16": "ViT-L/16", "vit_h14": "ViT-H/14"}
TINY_MODEL = dict(depth=2, embed_dim=64, num_heads=2)  # --tiny: same code, a model that runs in ms


class PlainBooster:
    """What `vitlarge.train.engine.Engine` uses of Colossal-AI's Booster, on one device without it.

    At world size 1 DDP's only effect is its bucketed all-reduce with itself, so leaving the model
    unwrapped measures the same compute; ``no_sync`` then has nothing to suppress."""

    def boost(self, model, optimizer):
        return model, optimizer

    def no_sync(self, model=None, optimizer=None):
        return contextlib.nullcontext()

    def backward(self, loss, optimizer):
        loss.backward()


def kit_config(recipe: str, precision: str, micro_batch: int, accum_steps: int, tiny: bool, compile: bool = False):
    """The recipe with the kit's batch: ``micro_batch`` x ``accum_steps`` on one device; no Mixup/CutMix
    (the same timm call on both sides, left out of both), plugin ddp (one device: fsdp would shard nothing).
    ``train.compile`` is set, never ``auto`` (which is on with CUDA): the eager rows stay eager and the
    compiled contender says so in its name."""
    from vitlarge.constants import IMAGENET_TRAIN_EXAMPLES

    over = {}
    if tiny:
        patch = 14 if recipe == "vit_h14" else 16
        over = {"model.kwargs": dict(TINY_MODEL), "data.image_size": 2 * patch}
    over |= {
        "augment.mixup_alpha": 0.0,
        "augment.cutmix_alpha": 0.0,
        "train.precision": precision,
        "train.plugin": "ddp",
        "train.compile": "on" if compile else "off",
        "train.micro_batch": micro_batch,
        "train.global_batch": micro_batch * accum_steps,
        "data.num_train_examples": IMAGENET_TRAIN_EXAMPLES,
    }
    return bench_config(recipe, over, check=f"benchmarks.gpu ({recipe})")


def synthetic_batch(cfg, device: torch.device, size: int | None = None) -> tuple:
    """One fixed batch of normalised-looking images and labels on ``device`` (fp32, like the loader's)."""
    return make_batches(cfg, 1, device=device, size=size)[0]


class EngineRun:
    """vitlarge's engine exactly as train.py builds it (one builder), on synthetic data."""

    def __init__(self, cfg, device: torch.device, path: str):
        parts = build_parts(cfg, 1, device, booster=None if path == "colossalai" else PlainBooster())
        self.engine, self.batch = parts.engine, synthetic_batch(cfg, device)
        self.attention = parts.attention  # the attention kernel the builder chose and logged
        self.params = sum(p.numel() for p in parts.model.parameters())
        self.steps = self.skipped = 0

    def set_batch(self, batch: tuple) -> None:
        """A new batch (size); gradients a step that ran out of memory left behind are dropped."""
        self.batch = batch
        self.engine.torch_optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        m = self.engine.step(self.steps, lambda: self.batch)
        self.steps += 1
        self.skipped += m.skipped
