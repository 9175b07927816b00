"""In-memory batches, the engine as train.py builds it, and ONE bare PyTorch loop to compare it with.

`BareLoop` is what a user would write: autocast, GradScaler (fp16 only), accumulation,
``clip_grad_norm_`` and ``optimizer.step()``; no DDP, no schedule. Its optimizer is a parameter:
the CPU benchmark gives it vitlarge's (`vitlarge_optimizer`), the GPU kit timm's Lamb over timm's
weight-decay groups (`timm_lamb`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import torch


def make_batches(cfg, n: int = 4, seed: int = 0, device=None, size: int | None = None) -> list:
    """``n`` batches of normal images and labels (fp32, like the loader's) of ``size`` (default the
    micro-batch), drawn on ``device`` from a generator seeded ``seed``."""
    g = torch.Generator(device=device or "cpu").manual_seed(seed)
    s, b = cfg.data.image_size, size or cfg.train.micro_batch
    return [
        (
            torch.randn(b, 3, s, s, device=device, generator=g),
            torch.randint(0, cfg.data.num_classes, (b,), device=device, generator=g),
        )
        for _ in range(n)
    ]


class InMemoryLoader:
    """A train loader over pre-made batches, cycling; has what the Trainer uses (``next``, ``state``)."""

    def __init__(self, batches: list):
        self.batches, self.i = batches, 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.batches[self.i % len(self.batches)]
        self.i += 1
        return batch

    def state(self) -> str:
        return json.dumps({"i": self.i})


def build_engine(cfg, world_size: int = 1, device="cpu", booster=None):
    """The engine exactly as train.py builds it (`vitlarge.train.assemble.build`; process group already up)."""
    return build_parts(cfg, world_size, device, booster).engine


def build_parts(cfg, world_size: int = 1, device="cpu", booster=None):
    from vitlarge.plan.plan import make_plan
    from vitlarge.train.assemble import build
    from vitlarge.train.settings import resolve_settings

    return build(
        cfg, make_plan(cfg, world_size, cfg.data.num_train_examples), resolve_settings(cfg, device), booster=booster
    )


def vitlarge_optimizer(model, cfg):
    """The recipe's optimizer as `vitlarge.optim.lamb.build_optimizer` makes it."""
    from vitlarge.optim.lamb import build_optimizer

    return build_optimizer(model, cfg.optim)


def timm_lamb(model, cfg):
    """timm's Lamb (its own clipping off: the loop clips) over timm's weight-decay groups with the
    model's no-decay names (pos_embed, cls_token), as in `vitlarge.optim.lamb.param_groups`: like for like."""
    import timm.optim

    o = cfg.optim
    groups = timm.optim.param_groups_weight_decay(model, o.weight_decay, no_weight_decay_list=model.no_weight_decay())
    return timm.optim.Lamb(
        groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, max_grad_norm=None
    )


class BareLoop:
    """The recipe's model (`vitlarge.model.vit.build_model`, seeded) trained by plain PyTorch with ``optimizer(model, cfg)``.

    Contract: ``step()`` runs one optimizer step (``global_batch / micro_batch`` forward/backward
    passes) on the next of ``batches`` (cycling) or, without them, on ``batch`` (one fixed batch,
    replaceable), and returns the last micro-step's loss as a tensor (no host read). ``skipped``
    counts the steps the fp16 scaler skipped (non-finite gradients); it reads the device, so read it
    outside timed regions. Clipping at ``clip_grad_norm <= 0`` is off, as in the engine.
    """

    def __init__(self, cfg, device, optimizer: Callable, batches: list | None = None):
        from vitlarge.model.precision import DTYPES
        from vitlarge.model.vit import build_model

        device = torch.device(device)
        torch.manual_seed(cfg.train.seed)
        self.model = build_model(cfg, device)
        self.opt = optimizer(self.model, cfg)
        self.device, self.dtype = device, DTYPES[cfg.train.precision]
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.precision == "fp16")
        self.accum = cfg.train.global_batch // cfg.train.micro_batch
        self.clip = cfg.optim.clip_grad_norm if cfg.optim.clip_grad_norm > 0 else math.inf
        self.loader = InMemoryLoader(batches) if batches else None
        self.batch = None if batches else make_batches(cfg, 1, device=device)[0]
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

    def step(self) -> torch.Tensor:
        images, labels = next(self.loader) if self.loader else self.batch
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
        return loss


def single_process(tiny: bool) -> int:
    """Setup of a one-process engine benchmark: torch threads (`results.threads`) and a gloo group of
    one, as train.py makes it; returns the threads."""
    from benchmarks.harness import results, spawn

    threads = results.threads(tiny)
    torch.set_num_threads(threads)
    spawn.init_single_process_group()
    return threads


def engine_stepper(engine, batches: list) -> Callable[[], None]:
    """One optimizer step of ``engine`` per call, on ``batches`` from the first (the engine takes as
    many as its accumulation needs), its step count going up by one each time."""
    count = [0]

    def step() -> None:
        count[0] += 1
        it = iter(batches)
        engine.step(count[0], lambda: next(it))

    return step
