"""Training phases: each with its own image size, batch, crop scale and lr; a run without phases is one.

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
phase 0 with the recipe's values. A phase ends where the next starts, the last at ``train.epochs``. A recipe without
``train.phases`` is one phase with the recipe's values: every run takes the same path.

Contracts:

* `check` validates the list with no world size (order, keys, sizes divisible by the patch size,
  batches); `plan_phases` derives each phase's accumulation and steps for a world size (a phase
  batch it cannot divide is a UserError). Both raise before any data is touched.
* Steps: phase i covers optimizer steps ``[start_step, end_step)``; its length is
  its epochs x its steps per epoch, boundaries rounded once from the cumulative count (no drift: with
  one batch throughout the total is the unphased plan's). A phase's micro batch is capped at
  ``global_batch / world size`` (the recipe's value is a per-device ceiling); the one phase of a
  recipe without ``train.phases`` takes ``train.micro_batch`` as given.
* `Plan.lr_at` is a pure function of the optimizer step: the recipe's warmup/decay over the whole
  run's steps (warmup ends at the step where ``schedule.warmup_epochs`` is reached), times the
  phase's ``lr_scale``, or the phase's own ``lr`` segment. Resuming is restoring the step.
* Periodic evaluation (``train.eval_every_epochs``) is converted to steps with the first phase's
  steps per epoch; ``epoch`` in the logs follows each phase's own.
* The model keeps the pos-embed grid of ``data.image_size`` and is built with timm's
  ``dynamic_img_size=True``: every forward resamples it (bicubic) to the input's grid, so parameter
  shapes, optimizer state and checkpoints never change with the phase.
* `vitlarge.data.phased.PhasedLoaders` rebuilds the loaders at a boundary (`vitlarge.data.sources`: DALI pipelines decoding
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
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from vitlarge.config.phase_list import entries, resolve_phases
from vitlarge.config.schema import Config, PhaseEntry
from vitlarge.errors import UserError
from vitlarge.text import plural

T = TypeVar("T")


def filled(value: T | None) -> T:
    """A key of a resolved entry (`resolve_phases` fills in every one but ``lr``, whose None is the schedule's)."""
    assert value is not None, "a key of a resolved phase entry"
    return value


@dataclass(frozen=True)
class Phase:
    """One phase planned for one world size: the resolved entry it plans (``entry``, world-size free: what the phase
    list's fingerprint hashes, `vitlarge.data.phased.fingerprint`) and what the world size and the data set decide,
    which an entry cannot hold: the micro batch capped at ``global_batch / world size``, the accumulation, the
    steps per epoch and the step range. Its copies of the entry's sizes, crop scale, lr and ``rect_val`` (whether
    the phase validates rectangular batches, `vitlarge.data.rect`) are the values the training loop and the
    loaders read (``start_epoch``: the entry's ``epoch`` as a float)."""

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
    rect_val: bool
    steps_per_epoch: int
    start_step: int
    end_step: int
    entry: PhaseEntry

    @property
    def steps(self) -> int:
        return self.end_step - self.start_step


def plan_phases(
    cfg: Config, resolved: Sequence[PhaseEntry], world_size: int, num_train_examples: int, offset: float = 0.0
) -> tuple[Phase, ...]:
    """Per-phase accumulation, steps per epoch and step range of ``cfg``'s phases, ``resolved``
    (`vitlarge.config.phase_list.resolve_phases`); UserError when a batch does not divide.

    A phase's micro batch is ``min(its micro_batch, its global_batch / world size)``: a recipe's
    per-device micro batch is a memory ceiling, so the same recipe runs on more devices (fewer
    accumulation steps) as a fixed-resolution recipe does. Step boundaries are rounded from the
    cumulative (fractional) step count at each absolute start epoch, so rounding never drifts: with
    one steps-per-epoch throughout, the total equals the unphased plan's. ``offset``: steps added to every
    boundary (a resume that counts its epochs on from another batch's, `vitlarge.plan.plan.EpochCount`); with one,
    the last boundary is rounded up, so the run ends at ``train.epochs`` passes of the loader, not a step short."""
    phases, exact = [], offset  # exact: the fractional optimizer step where the current phase starts
    listed = bool(cfg.train.phases)
    for i, p in enumerate(resolved):
        key = f"train.phases[{i}]"
        gb, epoch = filled(p.global_batch), filled(p.epoch)
        capped = listed and gb % world_size == 0
        micro = min(filled(p.micro_batch), gb // world_size) if capped else filled(p.micro_batch)
        per_step = micro * world_size
        if gb % per_step:
            names = (f"{key}: global_batch", "micro_batch") if listed else ("train.global_batch", "train.micro_batch")
            raise UserError(_undivided(names, gb, micro, world_size))
        # Drop the last partial global batch of each epoch, as the original did: every optimizer step
        # sees exactly global_batch images, so the lr schedule means the same at any world size.
        spe = num_train_examples // gb
        if spe == 0:
            where = f"{key}: global_batch={gb}" if listed else f"train.global_batch={gb}"
            fix = "lower it" if listed else "lower train.global_batch"
            raise UserError(f"{where} is larger than the {num_train_examples} training images; {fix}")
        end_epoch = filled(resolved[i + 1].epoch) if i + 1 < len(resolved) else cfg.train.epochs
        start_step = epochs_to_steps(exact, 1)
        exact += (end_epoch - epoch) * spe
        end_step = epochs_to_steps(exact, 1)
        if offset and i + 1 == len(resolved):  # counted on from other batches: the last step is the first at or
            end_step = math.ceil(exact - 1e-9)  # past train.epochs, never short of them (float noise aside)
        phases.append(
            Phase(
                index=i,
                start_epoch=float(epoch),
                end_epoch=float(end_epoch),
                image_size=filled(p.image_size),
                eval_size=filled(p.eval_size),
                global_batch=gb,
                micro_batch=micro,
                accum_steps=gb // per_step,
                crop_scale=filled(p.crop_scale),
                lr_scale=float(filled(p.lr_scale)),
                lr=p.lr,
                rect_val=filled(p.rect_val),
                steps_per_epoch=spe,
                start_step=start_step,
                end_step=end_step,
                entry=p,
            )
        )
    return tuple(phases)


def _undivided(names: tuple[str, str], gb: int, micro: int, world_size: int) -> str:
    """The error line for a global batch ``gb`` that ``micro x world_size`` does not divide, with the fixes there
    are: where ``world_size`` itself does not divide ``gb`` no micro batch can, so it names the nearest device
    counts that do and the nearest global batches ``world_size`` divides."""
    if gb % world_size == 0:
        return (
            f"{names[0]}={gb} is not divisible by {names[1]} x world size = "
            f"{micro} x {world_size} = {micro * world_size}; pick a micro_batch or device count that divides it"
        )
    small = [d for d in range(1, math.isqrt(gb) + 1) if gb % d == 0]
    divisors = sorted({*small, *(gb // d for d in small)})
    below = max(d for d in divisors if d < world_size)
    above = next((d for d in divisors if d > world_size), None)
    counts = f"{below} or {above} processes" if above else plural(below, "process")
    lo = gb - gb % world_size
    batches = f"{lo} or {lo + world_size}" if lo else str(world_size)
    return (
        f"{names[0]}={gb} does not divide over {plural(world_size, 'process')}, so no {names[1]} can split it "
        f"evenly; run on {counts} (dividing {gb}), or make it a multiple of {world_size} ({batches})"
    )


def step_at_epoch(phases, epochs: float, offset: float = 0.0) -> int:
    """The optimizer step at which ``epochs`` of training are done (phase by phase, rounded once from
    the cumulative fractional step count, as the phase boundaries are; ``offset`` as in `plan_phases`)."""
    return epochs_to_steps(offset + exact_step(phases, epochs), 1)


def exact_step(phases, epochs: float) -> float:
    """The fractional optimizer step at which ``epochs`` of training are done, counted from step 0 at epoch 0."""
    exact = 0.0
    for ph in phases:
        if epochs <= ph.end_epoch or ph is phases[-1]:
            return exact + max(0.0, epochs - ph.start_epoch) * ph.steps_per_epoch
        exact += (ph.end_epoch - ph.start_epoch) * ph.steps_per_epoch
    return 0.0


def epochs_to_steps(epochs: float, steps_per_epoch: int) -> int:
    """The one conversion from an epoch count to optimizer steps."""
    return int(math.floor(epochs * steps_per_epoch + 0.5))


def new_boundaries_before(saved: dict, cfg: Config, num_train_examples: int, step: int) -> str | None:
    """The error line when ``cfg``'s ``train.phases`` starts a phase before ``step`` where the list a checkpoint
    was written under did not (``saved``: the config in its meta.json). The steps before ``step`` were trained
    under the old boundaries; a list that moves or adds one there describes a run that did not happen, and
    its phases' data and lr would not follow from the checkpoint. None when every boundary before ``step`` is
    an old one (edits after ``step``, and removing phases, are absorbed: docs/PROGRESSIVE.md)."""
    old = copy.deepcopy(cfg)
    t = saved.get("train", {})
    for key in ("global_batch", "micro_batch", "epochs"):
        if key in t:
            setattr(old.train, key, t[key])
    try:  # boundaries do not depend on the world size: one process plans them
        old.train.phases = entries(t.get("phases") or [])  # the dict form meta.json keeps
        was = {p.start_step for p in plan_phases(old, resolve_phases(old), 1, num_train_examples)}
        now = plan_phases(cfg, resolve_phases(cfg), 1, num_train_examples)
    except (UserError, TypeError, ValueError, KeyError):  # a list this version cannot plan: nothing to compare
        return None
    moved = [p for p in now if 0 < p.start_step < step and p.start_step not in was]
    if not moved:
        return None
    p = moved[0]
    return (
        f"train.phases[{p.index}] starts at step {p.start_step} (epoch {p.start_epoch:g}), before step {step} where "
        f"this run resumes, and the checkpoint's phase list had no boundary there (this recipe's train.phases, "
        f"global batch or epochs moved it): keep the boundaries before step {step} as they were (edit only later "
        "phases), or start a new workdir with model.init_from=<the checkpoint>"
    )
