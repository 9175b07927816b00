"""One optimizer step: accumulation micro-steps, autocast, loss scaling, clipping, LAMB.

Contract: ``Engine.step(step, next_batch)`` takes the 0-based index of the optimizer step about to
be taken and a callable returning one rank-local micro-batch ``(images, labels)`` on the device.
It runs the step's phase's ``accum_steps`` forward/backward passes; every pass but the last sits inside
``booster.no_sync`` so DDP all-reduces (FSDP2 reduce-scatters) gradients once per optimizer step (FSDP2 with
``train.fsdp_accumulation`` reduce_scatter, the default under bf16/fp16: every micro-step, keeping only sharded
fp32 gradients). The loss returned is this
rank's mean over its micro-batches (the trainer averages it over ranks). Gradients are unscaled
before the global norm is measured and clipped; a step whose gradients are not finite is skipped
(fp16: by the scaler, which also lowers the scale; bf16/fp32: by us) and reported as ``skipped``.
With ``train.ema_decay`` the model EMA (`vitlarge.model.ema`) is updated after every applied update.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from vitlarge.config.schema import Config
from vitlarge.model.ema import ModelEma
from vitlarge.model.precision import Precision
from vitlarge.plan.plan import Plan
from vitlarge.train.settings import Settings


class CommCounter:
    """DDP comm hook state: counts gradient all-reduce calls and bytes (cheap; always on)."""

    def __init__(self):
        self.calls = 0
        self.bytes = 0

    @staticmethod
    def hook(state: CommCounter, bucket):
        state.calls += 1
        state.bytes += bucket.buffer().numel() * bucket.buffer().element_size()
        # torch annotates process_group as ProcessGroup; its body takes None for the default group, as here
        return default_hooks.allreduce_hook(None, bucket)  # pyright: ignore[reportArgumentType]


def build_criterion(cfg: Config):
    """``(mixup, loss)`` from timm: Mixup/CutMix (None when both are off) and the loss of ``augment.loss``.

    ``ce``: soft-target cross-entropy under Mixup/CutMix (smoothing folded into the mixed targets), else
    label-smoothing or plain cross-entropy. ``bce``: timm's ``BinaryCrossEntropy`` (mean over images and
    classes) on Mixup's dense targets, or on the labels, one-hot and smoothed inside it; with
    ``augment.bce_target_thresh`` either is thresholded to 0/1. Every loss is a mean over the micro-batch,
    so the engine's ``loss / accum`` is the global batch's mean whatever the accumulation and world size.
    (timm's train.py falls back to cross-entropy for ``--bce-loss`` without Mixup or smoothing; here bce is bce.)"""
    from timm.data import Mixup  # lazy: keeps timm off a run's pre-flight checks
    from timm.loss import (  # lazy: keeps timm off a run's pre-flight checks
        BinaryCrossEntropy,
        LabelSmoothingCrossEntropy,
        SoftTargetCrossEntropy,
    )

    a = cfg.augment
    mixup = None
    if a.mixup_alpha > 0 or a.cutmix_alpha > 0:
        mixup = Mixup(
            mixup_alpha=a.mixup_alpha,
            cutmix_alpha=a.cutmix_alpha,
            prob=a.mixup_prob,
            label_smoothing=a.label_smoothing,
            num_classes=cfg.data.num_classes,
        )
    if a.loss == "bce":
        # Mixup's targets are dense and already smoothed: BinaryCrossEntropy smooths index targets only.
        return mixup, BinaryCrossEntropy(smoothing=a.label_smoothing, target_threshold=a.bce_target_thresh)
    if mixup is not None:
        return mixup, SoftTargetCrossEntropy()
    if a.label_smoothing > 0:
        return None, LabelSmoothingCrossEntropy(a.label_smoothing)
    return None, torch.nn.CrossEntropyLoss()


def build_erasing(cfg: Config, device: torch.device):
    """timm's ``RandomErasing`` of ``augment.random_erase_prob`` (mode ``pixel``, one region, noise drawn on
    ``device``), or None when it is 0. It erases a normalised micro-batch in place, image by image, with Python's
    ``random`` for the rectangles and torch's generator of ``device`` for the noise."""
    from timm.data.random_erasing import RandomErasing  # lazy: keeps timm off a run's pre-flight checks

    p = cfg.augment.random_erase_prob
    # timm annotates ``device`` as a str; it only hands it to torch, which takes a torch.device as well
    return RandomErasing(probability=p, mode="pixel", max_count=1, device=cast(str, device)) if p > 0 else None


def augment_batch(images: torch.Tensor, labels: torch.Tensor, mixup, erase) -> tuple[torch.Tensor, torch.Tensor]:
    """One normalised micro-batch through Mixup/CutMix (``mixup``, or None), then random erasing (``erase``, or
    None): ``(images, targets)``, the targets Mixup's dense ones (else ``labels``). The images may be changed in place.

    Erasing comes after Mixup, as in timm's train.py by default (the order its numbers are obtained with): its
    prefetcher mixes in the collate and ``PrefetchLoader`` erases the normalised, mixed batch, so a rectangle
    covers both images of a pair. Erasing before Mixup (timm's ``--no-prefetcher`` order, each image erased once)
    trained below timm's train.py on the digits peer benchmark (docs/DATA.md, "Against timm's train.py"). DeiT III's own recipe erases nothing (recipes/deit3_b16.py keeps
    ``augment.random_erase_prob`` 0), so this order matters only where a recipe turns erasing on."""
    if mixup is not None:
        images, labels = mixup(images, labels)
    if erase is not None:
        images = erase(images)
    return images, labels


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did. ``loss`` stays on the device (reading it waits for the step)."""

    loss: torch.Tensor  # mean over the step's micro-batches, fp32, before loss scaling
    lr: float  # the schedule's; under optim.layer_decay each group steps with lr x its scale (Engine.lr_scales)
    grad_norm: float  # after unscaling, before clipping; inf or nan on an overflowed step
    loss_scale: float  # the fp16 scale the step ran with (1.0 without scaling)
    skipped: bool  # the update was not applied (non-finite gradients)
    data_time: float  # seconds spent waiting for the loader
    # All-reduce calls a DDP comm hook saw; None under FSDP2, which reduce-scatters outside any hook.
    allreduce_calls: int | None


class Engine:
    """Owns the boosted model and optimizer (and the model EMA); knows nothing about data sources, logging or where
    checkpoints go: it offers its state (`state`) and the checkpoint store saves and restores it."""

    def __init__(
        self,
        cfg: Config,
        plan: Plan,
        booster,
        model,
        optimizer,
        precision: Precision,
        settings: Settings,
        ema: ModelEma | None = None,
    ):
        self.cfg, self.plan, self.settings = cfg, plan, settings
        self.ema = ema  # train.ema_decay: the average of the boosted model (vitlarge.train.assemble.build)
        self.booster, self.model, self.optimizer = booster, model, optimizer
        self.precision = precision
        self.mixup, self.criterion = build_criterion(cfg)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.erase = build_erasing(cfg, self.params[0].device)
        # Layer-wise lr decay (`vitlarge.optim.lamb.param_groups`): each group's share of the schedule's lr, read
        # now, from the recipe's groups. Loading a checkpoint replaces the groups' settings with the saved ones, and
        # a resume with another optim.layer_decay must still follow the recipe, as the schedule does.
        self.lr_scales = [g.get("lr_scale", 1.0) for g in self.torch_optimizer.param_groups]
        self.comm = CommCounter()
        ddp = getattr(model, "module", None)
        is_ddp = isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
        if is_ddp:
            ddp.register_comm_hook(self.comm, CommCounter.hook)
        # 2 ranks sum a + b == b + a in any layout; from 3 the layout decides the rounding (`_settle_buckets`).
        self._buckets_unsettled = is_ddp and torch.distributed.get_world_size() >= 3
        # FSDP2: each rank holds a piece of every gradient (DTensors); the global norm sums them over the ranks.
        self.fsdp = isinstance(ddp, FSDPModule)
        self.reduce_every_micro_step = self.fsdp and settings.fsdp_reduce_every_micro_step

    @property
    def torch_optimizer(self) -> torch.optim.Optimizer:
        return getattr(self.optimizer, "optim", self.optimizer)

    def lr(self, step: int) -> float:
        return self.plan.lr_at(self.cfg, step)

    def _settle_buckets(self, images: torch.Tensor) -> None:
        """DDP's gradient buckets as every step of an uninterrupted run after its first has them, before this
        process's first step, so that a resumed run sums each gradient over the ranks in the same order.

        torch's DDP all-reduces its first synced backward in one buffer (parameters in reverse order) and then
        rebuilds its buckets in the order the gradients became ready. Without this, the first step after a
        resume took the first layout where the uninterrupted run had the rebuilt one: every gradient at another
        offset, summed over 3+ ranks in another order, and the weights left it in the last bit. One backward of
        a zero micro-batch of the step's shape (the same graph, so the same ready order and, compiled, the same
        graph), with the RNGs restored after it and its gradients discarded, records that order."""
        self._buckets_unsettled = False
        device = images.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type):
            with self.precision.autocast():
                logits = self.model(torch.zeros_like(images))
            logits.float().sum().backward()
        self.torch_optimizer.zero_grad(set_to_none=True)

    def step(self, step: int, next_batch: Callable[[], tuple]) -> StepResult:
        self.model.train()
        opt, scaler = self.torch_optimizer, self.precision.scaler
        lr = self.lr(step)
        for group, scale in zip(opt.param_groups, self.lr_scales, strict=True):
            group["lr"] = lr * scale
        accum = self.plan.phase_at(step).accum_steps
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.params[0].device)
        data_time = 0.0
        calls_before = self.comm.calls
        for micro in range(accum):
            t0 = time.perf_counter()
            images, labels = next_batch()
            data_time += time.perf_counter() - t0
            if self._buckets_unsettled:
                self._settle_buckets(images)
                calls_before = self.comm.calls
            images, labels = augment_batch(images, labels, self.mixup, self.erase)
            sync = micro == accum - 1 or self.reduce_every_micro_step
            with contextlib.nullcontext() if sync else self.booster.no_sync(self.model, self.optimizer):
                with self.precision.autocast():
                    logits = self.model(images)
                loss = self.criterion(logits.float(), labels)
                scaler.scale(loss / accum).backward()
            loss_sum += loss.detach()
        scale = self.precision.loss_scale
        scaler.unscale_(opt)
        max_norm = self.cfg.optim.clip_grad_norm if self.cfg.optim.clip_grad_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        # Under FSDP2 the norm of DTensor gradients is a replicated DTensor (one all-reduce of the squares).
        grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        finite = math.isfinite(grad_norm)
        if scaler.is_enabled():
            scaler.step(opt)  # skips the update itself when unscale_ found inf/nan
            scaler.update()
        elif finite:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if self.ema is not None and finite:
            self.ema.update(step + 1)
        return StepResult(
            loss=loss_sum / accum,
            lr=lr,
            grad_norm=grad_norm,
            loss_scale=scale,
            skipped=not finite,
            data_time=data_time,
            allreduce_calls=None if self.fsdp else self.comm.calls - calls_before,
        )
