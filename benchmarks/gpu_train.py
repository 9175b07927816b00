"""The training contenders of the GPU kit (benchmarks/gpu.py): vitlarge's engine and a bare PyTorch loop.

Both train the same timm ViT (`vitlarge.model.vit.build_model`, the recipe's dropouts, fused attention
on CUDA) on one synthetic batch already on the device, so the figure is the compute side only:

- ``EngineRun``: what train.py runs per optimizer step, built by `vitlarge.train.assemble.build`
  (autocast, GradScaler for fp16, accumulation micro-steps, global-norm clipping after unscale,
  vitlarge's LAMB with the no-decay groups, the lr schedule), with ``train.compile`` off or on. Its Booster is Colossal-AI's
  (TorchDDPPlugin at world size 1) when Colossal-AI imports, else `PlainBooster`.
- ``BareLoop``: what a user writes: autocast, GradScaler, accumulation, ``clip_grad_norm_`` and
  timm's ``Lamb`` over timm's weight-decay groups with the model's no-decay names (the same split as
  vitlarge's); no DDP, no schedule.

Contract: ``step()`` runs one optimizer step (``accum_steps`` forward/backward passes of
``micro_batch`` images) and returns nothing the host must wait for beyond what the loop itself
reads (the engine reads the gradient norm, as in training). ``skipped`` counts the steps that did
not update (non-finite gradients) so far; read it outside timed regions.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
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
    from vitlarge.config.load import load_recipe, validate
    from vitlarge.constants import IMAGENET_TRAIN_EXAMPLES

    cfg = load_recipe(ROOT / "recipes" / f"{recipe}.py")
    if tiny:
        cfg.model.kwargs = dict(TINY_MODEL)
        patch = 14 if "patch14" in cfg.model.name else 16
        cfg.data.image_size = 2 * patch
    cfg.augment.mixup_alpha = cfg.augment.cutmix_alpha = 0.0
    cfg.train.precision = precision
    cfg.train.plugin = "ddp"
    cfg.train.compile = "on" if compile else "off"
    cfg.train.micro_batch = micro_batch
    cfg.train.global_batch = micro_batch * accum_steps
    cfg.data.num_train_examples = IMAGENET_TRAIN_EXAMPLES
    validate(cfg, f"benchmarks.gpu ({recipe})")
    return cfg


def synthetic_batch(cfg, device: torch.device, size: int | None = None) -> tuple:
    """One fixed batch of normalised-looking images and labels on ``device`` (fp32, like the loader's)."""
    g = torch.Generator(device=device).manual_seed(0)
    b, s = size or cfg.train.micro_batch, cfg.data.image_size
    return (
        torch.randn(b, 3, s, s, device=device, generator=g),
        torch.randint(0, cfg.data.num_classes, (b,), device=device, generator=g),
    )


class EngineRun:
    """vitlarge's engine exactly as train.py builds it (one builder), on synthetic data."""

    def __init__(self, cfg, device: torch.device, path: str):
        from vitlarge.plan.plan import make_plan
        from vitlarge.train.assemble import build

        plan = make_plan(cfg, 1, cfg.data.num_train_examples)
        parts = build(cfg, plan, device, booster=None if path == "colossalai" else PlainBooster())
        self.engine, self.batch = parts.engine, synthetic_batch(cfg, device)
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


class BareLoop:
    """A bare PyTorch loop on the same model with timm's Lamb (its own clipping off: we clip outside)."""

    def __init__(self, cfg, device: torch.device):
        import timm.optim

        from vitlarge.model.precision import DTYPES
        from vitlarge.model.vit import build_model

        torch.manual_seed(cfg.train.seed)
        self.model = build_model(cfg, device)
        o = cfg.optim
        # the model's no-decay names (pos_embed, cls_token) as in vitlarge.optim.lamb.param_groups: like for like
        groups = timm.optim.param_groups_weight_decay(
            self.model, o.weight_decay, no_weight_decay_list=self.model.no_weight_decay()
        )
        self.opt = timm.optim.Lamb(
            groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, max_grad_norm=None
        )
        self.device, self.dtype = device, DTYPES[cfg.train.precision]
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.precision == "fp16")
        self.accum = cfg.train.global_batch // cfg.train.micro_batch
        self.clip = cfg.optim.clip_grad_norm if cfg.optim.clip_grad_norm > 0 else math.inf  # as the engine: <= 0 is off
        self.batch = synthetic_batch(cfg, device)
        self.steps = 0
        # The scale after every step, kept on the device (no host read in the timed loop): a step the
        # scaler skips lowers it, so `skipped` counts the drops afterwards.
        self._scales = [self._scale()] if self.scaler.is_enabled() else []

    def _scale(self) -> torch.Tensor:
        if self.scaler._scale is None:  # created lazily by the first scale(); same initial value
            self.scaler.scale(torch.zeros((), device=self.device))
        return self.scaler._scale.detach().clone()

    @property
    def skipped(self) -> int:
        """Optimizer steps the GradScaler skipped so far (its scale dropped); reads the device."""
        return sum(int(b < a) for a, b in zip(self._scales, self._scales[1:]))

    def step(self) -> None:
        images, labels = self.batch
        self.model.train()
        for _ in range(self.accum):
            with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
                logits = self.model(images)
            loss = torch.nn.functional.cross_entropy(logits.float(), labels)
            self.scaler.scale(loss / self.accum).backward()
        self.scaler.unscale_(self.opt)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1
        if self._scales:
            self._scales.append(self._scale())
