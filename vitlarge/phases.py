"""Progressive resolution: training phases with their own image size, batch, crop scale and lr.

A recipe sets ``train.phases`` to a list of dicts, fast.ai/DIUx style::

    c.train.phases = [
        {"epoch": 0, "image_size": 128, "crop_scale": (0.35, 1.0)},
        {"epoch": 40, "image_size": 192, "global_batch": 16384, "lr_scale": 0.5},
        {"epoch": 85, "image_size": 224, "crop_scale": (0.08, 1.0), "eval_size": 256},
    ]

or builds them in one line from composer's parameters (`progressive`). Keys (`PHASE_KEYS`):
``epoch`` (start, required), ``image_size``, ``eval_size`` (validation size; default the phase's
``image_size``), ``global_batch``, ``micro_batch``, ``crop_scale``, ``lr_scale`` (multiplies the
recipe's schedule) or ``lr`` (a segment ``(start, end)``: linear over the phase's steps, replacing the
schedule there). A key not given carries over from the phase before (except ``eval_size`` and ``lr``,
which are the phase's own); the first phase starts from the recipe (``data.image_size``,
``train.global_batch``, ...). A first phase after epoch 0 gets an implicit
phase 0 with the recipe's values. A phase ends where the next starts, the last at ``train.epochs``.

Contracts:

* `check` validates the list with no world size (order, keys, sizes divisible by the patch size,
  batches); `plan_phases` derives each phase's accumulation and steps for a world size (a phase
  batch it cannot divide is a UserError). Both raise before any data is touched.
* Steps: phase i covers optimizer steps ``[start_step, end_step)``; its length is
  its epochs x its steps per epoch, boundaries rounded once from the cumulative count (no drift: with
  one batch throughout the total is the unphased plan's). A phase's micro batch is capped at
  ``global_batch / world size`` (the recipe's value is a per-device ceiling).
* `lr_at_step` is a pure function of the optimizer step: the recipe's warmup/decay over the whole
  run's steps (warmup ends at the step where ``schedule.warmup_epochs`` is reached), times the
  phase's ``lr_scale``, or the phase's own ``lr`` segment. Resuming is restoring the step.
* Periodic evaluation (``train.eval_every_epochs``) is converted to steps with the first phase's
  steps per epoch; ``epoch`` in the logs follows each phase's own.
* The model keeps the pos-embed grid of ``data.image_size`` and is built with timm's
  ``dynamic_img_size=True``: every forward resamples it (bicubic) to the input's grid, so parameter
  shapes, optimizer state and checkpoints never change with the phase.
* `PhasedLoaders` rebuilds the loaders at a boundary (`vitlarge.data.build`: DALI pipelines decoding
  straight to the phase's size, or the synthetic source at that size).
  Each phase's train stream starts afresh with its own seed (``train.seed + 1000 * phase``); the
  loader state in a checkpoint records its phase, so a resume in the same phase continues the
  stream exactly and a resume at a boundary starts the new phase's stream exactly as an
  uninterrupted run does. The state also holds a `fingerprint` of the phase list: after an edit of
  ``train.phases`` train.py drops it with one warning (weights, optimizer and step resume; the lr
  and the phase follow the new list at that step).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from dataclasses import dataclass

from vitlarge.config import Config, Plan, epochs_to_steps
from vitlarge.errors import UserError

PHASE_KEYS = ("epoch", "image_size", "eval_size", "global_batch", "micro_batch", "crop_scale", "lr_scale", "lr")
PHASE_SEED_STRIDE = 1000  # phase i's data stream uses train.seed + 1000 * i


@dataclass(frozen=True)
class Phase:
    """One phase, every key resolved, for one world size."""

    index: int
    start_epoch: float
    end_epoch: float
    image_size: int
    eval_size: int
    global_batch: int
    micro_batch: int
    accum_steps: int
    crop_scale: tuple
    lr_scale: float
    lr: tuple | None
    steps_per_epoch: int
    start_step: int
    end_step: int

    @property
    def steps(self) -> int:
        return self.end_step - self.start_step


def patch_size(cfg: Config) -> int:
    """The model's patch size: ``model.kwargs['patch_size']``, else the ``patchN`` in the timm name."""
    if "patch_size" in cfg.model.kwargs:
        return int(cfg.model.kwargs["patch_size"])
    m = re.search(r"patch(\d+)", cfg.model.name)
    return int(m.group(1)) if m else 1


def _fix_size(size: int, patch: int) -> str:
    lo = max(patch, size // patch * patch)
    return f"use {lo} or {lo + patch}"


def resolve(cfg: Config, origin: str = "config") -> list[dict]:
    """The phases with every key filled in (carried over), validated; [] for a recipe without phases."""
    raw = cfg.train.phases
    if not raw:
        return []
    base = dict(
        epoch=0.0,
        image_size=cfg.data.image_size,
        eval_size=None,
        global_batch=cfg.train.global_batch,
        micro_batch=cfg.train.micro_batch,
        crop_scale=tuple(cfg.data.crop_scale),
        lr_scale=1.0,
        lr=None,
    )
    patch, out, prev = patch_size(cfg), [], base
    for i, p in enumerate(raw):
        key = f"train.phases[{i}]"
        if not isinstance(p, dict):
            raise UserError(
                f"{origin}: {key} is a {type(p).__name__}; give a dict like {{'epoch': 0, 'image_size': 128}}"
            )
        unknown = sorted(set(p) - set(PHASE_KEYS))
        if unknown:
            raise UserError(f"{origin}: {key} has unknown key '{unknown[0]}'; use {', '.join(PHASE_KEYS)}")
        if "epoch" not in p:
            raise UserError(
                f"{origin}: {key} has no 'epoch'; give the epoch the phase starts at, e.g. {{'epoch': 0, ...}}"
            )
        # eval_size follows the phase's image size and an lr segment belongs to its phase, unless given.
        cur = {**prev, "eval_size": None, "lr": None, **p}
        if "lr_scale" not in p and "lr" in p:
            cur["lr_scale"] = 1.0
        e = cur["epoch"]
        if not (isinstance(e, (int, float)) and math.isfinite(e) and 0 <= e < cfg.train.epochs):
            raise UserError(
                f"{origin}: {key}.epoch={e} must be in [0, train.epochs={cfg.train.epochs}); "
                "start every phase inside the schedule"
            )
        if out and e <= out[-1]["epoch"]:
            raise UserError(
                f"{origin}: {key}.epoch={e} is not after train.phases[{i - 1}].epoch={out[-1]['epoch']}; "
                "list phases in increasing order of their start epoch, without overlap"
            )
        for name in ("image_size", "eval_size", "global_batch", "micro_batch"):
            v = cur[name]
            if v is None and name == "eval_size":
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"{origin}: {key}.{name}={v!r} must be a positive integer")
        for name in ("image_size", "eval_size"):
            v = cur[name]
            if v is not None and v % patch:
                raise UserError(
                    f"{origin}: {key}.{name}={v} is not a multiple of the patch size {patch}; {_fix_size(v, patch)}"
                )
        if cur["global_batch"] % cur["micro_batch"]:
            raise UserError(
                f"{origin}: {key}: global_batch={cur['global_batch']} is not a multiple of "
                f"micro_batch={cur['micro_batch']}; change one of them"
            )
        cs = tuple(cur["crop_scale"])
        if not (len(cs) == 2 and all(isinstance(x, (int, float)) for x in cs) and 0 < cs[0] <= cs[1] <= 1):
            raise UserError(
                f"{origin}: {key}.crop_scale={cur['crop_scale']} must be (low, high) with "
                "0 < low <= high <= 1, e.g. (0.35, 1.0)"
            )
        cur["crop_scale"] = tuple(float(x) for x in cs)
        if not (isinstance(cur["lr_scale"], (int, float)) and cur["lr_scale"] > 0):
            raise UserError(f"{origin}: {key}.lr_scale={cur['lr_scale']} must be positive, e.g. 0.5")
        if cur["lr"] is not None:
            seg = tuple(cur["lr"]) if isinstance(cur["lr"], (list, tuple)) else ()
            if not (len(seg) == 2 and all(isinstance(x, (int, float)) and x >= 0 for x in seg)):
                raise UserError(
                    f"{origin}: {key}.lr={cur['lr']} must be a segment (start, end) of two "
                    "non-negative rates, e.g. (1e-3, 1e-4)"
                )
            cur["lr"] = tuple(float(x) for x in seg)
        if (cfg.augment.mixup_alpha > 0 or cfg.augment.cutmix_alpha > 0) and cur["micro_batch"] % 2:
            raise UserError(f"{origin}: {key}.micro_batch={cur['micro_batch']}: Mixup/CutMix need an even micro batch")
        if not out and e > 0:  # the recipe's own values until the first listed phase
            out.append(dict(base, crop_scale=tuple(base["crop_scale"])))
        out.append(cur)
        prev = cur
    for p in out:
        p["eval_size"] = p["eval_size"] or p["image_size"]
    return out


def check(cfg: Config, origin: str = "config") -> None:
    """Validates ``train.phases`` (called by `vitlarge.config.validate`)."""
    resolve(cfg, origin)


def plan_phases(cfg: Config, world_size: int, num_train_examples: int) -> tuple[Phase, ...]:
    """Per-phase accumulation, steps per epoch and step range; UserError when a batch does not divide.

    A phase's micro batch is ``min(its micro_batch, its global_batch / world size)``: a recipe's
    per-device micro batch is a memory ceiling, so the same recipe runs on more devices (fewer
    accumulation steps) as a fixed-resolution recipe does. Step boundaries are rounded from the
    cumulative (fractional) step count at each absolute start epoch, so rounding never drifts: with
    one steps-per-epoch throughout, the total equals the unphased plan's."""
    phases, exact = [], 0.0  # exact: the fractional optimizer step where the current phase starts
    resolved = resolve(cfg)
    for i, p in enumerate(resolved):
        key = f"train.phases[{i}]"
        gb = p["global_batch"]
        micro = min(p["micro_batch"], gb // world_size) if gb % world_size == 0 else p["micro_batch"]
        per_step = micro * world_size
        if gb % per_step:
            raise UserError(
                f"{key}: global_batch={gb} is not divisible by micro_batch x world size = "
                f"{micro} x {world_size} = {per_step}; pick a micro_batch or device count that divides it"
            )
        spe = num_train_examples // gb
        if spe == 0:
            raise UserError(
                f"{key}: global_batch={gb} is larger than the {num_train_examples} training images; lower it"
            )
        end_epoch = resolved[i + 1]["epoch"] if i + 1 < len(resolved) else cfg.train.epochs
        start_step = epochs_to_steps(exact, 1)
        exact += (end_epoch - p["epoch"]) * spe
        phases.append(
            Phase(
                index=i,
                start_epoch=float(p["epoch"]),
                end_epoch=float(end_epoch),
                image_size=p["image_size"],
                eval_size=p["eval_size"],
                global_batch=gb,
                micro_batch=micro,
                accum_steps=gb // per_step,
                crop_scale=p["crop_scale"],
                lr_scale=float(p["lr_scale"]),
                lr=p["lr"],
                steps_per_epoch=spe,
                start_step=start_step,
                end_step=epochs_to_steps(exact, 1),
            )
        )
    return tuple(phases)


def step_at_epoch(phases, epochs: float) -> int:
    """The optimizer step at which ``epochs`` of training are done (phase by phase, rounded once from
    the cumulative fractional step count, as the phase boundaries are)."""
    exact = 0.0
    for ph in phases:
        if epochs <= ph.end_epoch or ph is phases[-1]:
            return epochs_to_steps(exact + max(0.0, epochs - ph.start_epoch) * ph.steps_per_epoch, 1)
        exact += (ph.end_epoch - ph.start_epoch) * ph.steps_per_epoch
    return 0


def phase_at(plan: Plan, step: int) -> Phase | None:
    """The phase optimizer step ``step`` (0-based) belongs to; None for a plan without phases."""
    if not plan.phases:
        return None
    for ph in plan.phases:
        if step < ph.end_step:
            return ph
    return plan.phases[-1]


def epoch_at(plan: Plan, step: int) -> float:
    """Epochs done after ``step`` optimizer steps."""
    if not plan.phases:
        return step / plan.steps_per_epoch
    ph = phase_at(plan, max(0, step - 1)) if step else plan.phases[0]
    return ph.start_epoch + (step - ph.start_step) / ph.steps_per_epoch


def lr_at_step(cfg: Config, plan: Plan, step: int) -> float:
    """The lr of optimizer step ``step`` in a phased plan (see the module docstring)."""
    from vitlarge.schedule import lr_at

    ph = phase_at(plan, step)
    if ph.lr is not None:
        start, end = ph.lr
        return start + (end - start) * (step - ph.start_step) / max(1, ph.steps - 1)  # ends at its last step
    s = cfg.schedule
    return ph.lr_scale * lr_at(
        step,
        peak_lr=cfg.optim.lr,
        total_steps=plan.total_steps,
        warmup_steps=plan.warmup_steps,
        decay=s.decay,
        min_lr_ratio=s.min_lr_ratio,
    )


def phase_config(cfg: Config, ph: Phase) -> Config:
    """A copy of ``cfg`` with the phase's image size, batches and crop scale: what its loaders are built from."""
    c = copy.deepcopy(cfg)
    c.data.image_size, c.data.crop_scale = ph.image_size, tuple(ph.crop_scale)
    c.train.global_batch, c.train.micro_batch = ph.global_batch, ph.micro_batch
    c.train.seed = cfg.train.seed + PHASE_SEED_STRIDE * ph.index
    return c


def progressive(
    cfg: Config,
    initial_scale: float = 0.5,
    delay_fraction: float = 0.5,
    finetune_fraction: float = 0.2,
    size_increment: int | None = None,
) -> list[dict]:
    """Phases after MosaicML composer's ``ProgressiveResizing``, in one line.

    The side is ``initial_scale * data.image_size`` for the first ``delay_fraction`` of
    ``train.epochs``, grows linearly to the full size until ``1 - finetune_fraction``, and stays full
    for the last ``finetune_fraction``; sizes are rounded down to ``size_increment`` (default: and at
    least: the patch size; it must be a multiple of it). Each distinct size is one phase, starting
    where composer's schedule first reaches it; batch and lr carry over (edit the phases to change them).
    The last phase is always ``data.image_size`` (with ``finetune_fraction=0`` it replaces the last
    rounded-down size), so the model trains and is evaluated at the size its export declares.
    """
    patch = patch_size(cfg)
    inc = size_increment or patch
    if inc % patch:
        raise UserError(
            f"progressive(size_increment={inc}): not a multiple of the patch size {patch}; use {patch * max(1, inc // patch)}"
        )
    if not (
        0 < initial_scale <= 1
        and 0 <= delay_fraction
        and 0 <= finetune_fraction
        and delay_fraction + finetune_fraction <= 1
    ):
        raise UserError(
            "progressive(): need 0 < initial_scale <= 1, delay_fraction, finetune_fraction >= 0 and "
            "delay_fraction + finetune_fraction <= 1"
        )
    full, epochs = cfg.data.image_size, cfg.train.epochs

    def size_at(frac: float) -> int:
        ramp = 1.0 - delay_fraction - finetune_fraction
        if frac < delay_fraction:
            scale = initial_scale
        elif ramp <= 0 or frac >= delay_fraction + ramp:
            scale = 1.0
        else:
            scale = initial_scale + (1 - initial_scale) * (frac - delay_fraction) / ramp
        return full if scale >= 1.0 else max(inc, int(scale * full) // inc * inc)

    phases, grid = [], 4096  # a fine grid of the run: the first point that reaches each size starts a phase
    for k in range(grid):
        size = size_at(k / grid)
        if not phases or size != phases[-1]["image_size"]:
            phases.append({"epoch": round(epochs * k / grid, 6), "image_size": size})
    # The last phase trains (and is evaluated) at the full size even when the ramp only reaches it
    # at the very end (finetune_fraction=0): it replaces the last rounded-down size.
    if phases[-1]["image_size"] != full:
        phases[-1]["image_size"] = full
    return phases


def fingerprint(cfg: Config) -> str:
    """A short hash of the resolved phase list (world-size independent): a checkpoint's data state is
    tied to it, so a resume after an edit of ``train.phases`` does not continue another phase's stream."""
    doc = json.dumps(resolve(cfg), sort_keys=True, default=list)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def state_of_other_phases(state: str | None, cfg: Config) -> bool:
    """Whether a checkpoint's data state was written under another phase list than ``cfg``'s (or
    without phases): train.py then drops it with one warning and each phase's stream starts afresh."""
    if not state:
        return False
    try:
        doc = json.loads(state)
        return doc.get("phases") != fingerprint(cfg)
    except (ValueError, TypeError, AttributeError):
        return True


class _PhaseTrain:
    """A phase's TrainLoader whose ``state()`` also records the phase it belongs to and the phase list."""

    def __init__(self, loader, phase: int, phases_hash: str):
        self.loader, self.phase, self.phases_hash = loader, phase, phases_hash

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.loader)

    def state(self) -> str:
        from vitlarge.data.common import STATE_VERSION

        return json.dumps(
            {"version": STATE_VERSION, "phase": self.phase, "phases": self.phases_hash, "loader": self.loader.state()}
        )


def split_state(state: str | None) -> tuple[int | None, str | None]:
    """(phase, loader state) from a checkpoint's data state written by `_PhaseTrain`; (None, None) for
    none, or for one a run without phases wrote (its stream cannot be continued by a phase's loader)."""
    if not state:
        return None, None
    try:
        doc = json.loads(state)
        return int(doc["phase"]), doc["loader"]
    except (ValueError, TypeError, KeyError):  # written without phases: the phase's stream starts afresh
        return None, None


class PhasedLoaders:
    """The train and validation loaders of the phase a step belongs to, rebuilt at boundaries.

    ``enter(step)`` returns ``(train, val)`` when ``step`` starts a phase other than the current one
    (the first call always does), else None. A checkpoint's state from the same phase continues that
    phase's stream; from an earlier phase it is dropped: the new phase starts its stream afresh, as
    an uninterrupted run does at the boundary.
    """

    def __init__(self, cfg: Config, plan: Plan, rank: int, world_size: int, device, state: str | None = None):
        self.cfg, self.plan, self.rank, self.world_size, self.device = cfg, plan, rank, world_size, device
        self.current: Phase | None = None
        self._state_phase, self._state = split_state(state)

    def changes_at(self, step: int) -> bool:
        """Whether ``enter(step)`` builds new loaders (the caller drops the old ones first)."""
        return self.current is None or phase_at(self.plan, step).index != self.current.index

    def enter(self, step: int):
        from vitlarge.data.build import train_loader, val_loader

        ph = phase_at(self.plan, step)
        if not self.changes_at(step):
            return None
        state = self._state if self._state_phase == ph.index else None
        self._state_phase = self._state = None  # used once, by the phase it belongs to
        self.current = ph
        pc = phase_config(self.cfg, ph)
        train = _PhaseTrain(
            train_loader(pc, self.rank, self.world_size, self.device, state=state), ph.index, fingerprint(self.cfg)
        )
        vc = copy.deepcopy(pc)
        vc.data.image_size = ph.eval_size
        return train, val_loader(vc, self.rank, self.world_size, self.device)


def release_loader_memory(device) -> None:
    """After the old phase's loaders are dropped: collect their pipelines and, on a GPU, hand DALI's
    freed pool blocks back (``nvidia.dali.backend.ReleaseUnusedMemory``, where this DALI has it), so the
    new phase's pipelines do not stack on the old ones' memory. The GPU branch is not run by the tests.
    A process that never loaded DALI (``data.source=synthetic``) has no DALI pool, and may have no DALI."""
    import gc
    import sys

    gc.collect()
    backend = sys.modules.get("nvidia.dali.backend")
    if getattr(device, "type", str(device)) == "cuda" and backend is not None:
        release = getattr(backend, "ReleaseUnusedMemory", None)
        if release is not None:
            release()
