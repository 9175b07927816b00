"""The plan of a run: its phases and step counts for one world size and data set size, and the seeds that follow them.

`make_plan` is the one place a config becomes step counts; everything that runs, logs or resumes a
step asks the plan (`Plan.phase_at`, `Plan.epoch_at`, `Plan.lr_at`) rather than the config. The seeds of a
phase's data stream (`stream_seed`) and of a rank's RNGs (`rng_seed`) are derived from the phase and the step the
run starts at, as the plan numbers them.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

from vitlarge.config.phase_list import resolve_phases
from vitlarge.config.schema import Config
from vitlarge.errors import UserError
from vitlarge.plan.phases import Phase, epochs_to_steps, exact_step, plan_phases, step_at_epoch
from vitlarge.plan.schedule import continued_lr, lr_at

PHASE_SEED_STRIDE = 1000  # phase i's data stream uses train.seed + 1000 * i


@dataclass(frozen=True)
class Continuation:
    """Where a resume under an edited schedule re-planned the lr (``schedule.on_edit=continue``,
    vitlarge/plan/edits.py): from optimizer step ``step`` on, the recipe's warmup and decay go on from ``base_lr``
    (the lr the checkpoint's own plan had at that step, before the phase's ``lr_scale``) instead of jumping to this
    plan's value there (`vitlarge.plan.schedule.continued_lr`). Each checkpoint of the run records it (meta.json's
    ``schedule``), so every later resume of the run plans the same lr."""

    step: int
    base_lr: float


@dataclass(frozen=True)
class EpochCount:
    """Where a resume under another global batch or data set size (vitlarge/plan/edits.py) counts the epochs on from:
    ``epoch`` epochs were done after ``step`` optimizer steps, under the checkpoint's plan. An epoch is one pass of
    the loader: its phase's steps per epoch, each of its global batch (the last partial batch dropped), whatever
    batch the epochs before were trained at. From ``step`` on the plan's phase boundaries, warmup end and last step
    (``train.epochs``) fall where those epochs are reached; the steps before it are the checkpoint's, and the plan
    places them where its own batches would have (a first phase may start at a negative step). Each checkpoint of
    the run records it (meta.json's ``schedule``), so every later resume counts the same epochs."""

    step: int
    epoch: float


@dataclass(frozen=True)
class Plan:
    """Step counts derived once from the config, the world size and the data set size."""

    world_size: int
    phases: tuple[Phase, ...]
    """One or more; a recipe without ``train.phases`` is one phase with its own values."""
    total_steps: int
    warmup_steps: int
    eval_every_steps: int
    """0: no periodic evaluation (``train.eval_every_epochs`` converted with the first phase's epochs)."""
    num_train_examples: int
    continues: Continuation | None = None
    """The lr re-planned from a resume step on (None: the recipe's schedule at every step)."""
    counted_from: EpochCount | None = None
    """Where the epochs count on from another batch's (None: every step at this plan's batches)."""

    def phase_at(self, step: int) -> Phase:
        """The phase optimizer step ``step`` (0-based) belongs to (the last phase past the end)."""
        for ph in self.phases:
            if step < ph.end_step:
                return ph
        return self.phases[-1]

    def epoch_at(self, step: int) -> float:
        """Epochs done after ``step`` optimizer steps (from ``counted_from`` on: its epochs, then this plan's)."""
        ph = self.phase_at(max(0, step - 1)) if step else self.phases[0]
        c = self.counted_from
        if c is not None and step >= c.step and ph.start_step <= c.step:
            return c.epoch + (step - c.step) / ph.steps_per_epoch
        return ph.start_epoch + (step - ph.start_step) / ph.steps_per_epoch

    def lr_at(self, cfg: Config, step: int) -> float:
        """The lr of optimizer step ``step``: the recipe's warmup and decay over the whole run (from
        ``continues.step`` on, re-planned from its lr), times the phase's ``lr_scale``, or the phase's own ``lr``
        segment (vitlarge/plan/phases.py)."""
        ph = self.phase_at(step)
        if ph.lr is not None:
            start, end = ph.lr
            return start + (end - start) * (step - ph.start_step) / max(1, ph.steps - 1)  # ends at its last step
        s, c = cfg.schedule, self.continues
        peak, total, warmup = cfg.optim.lr, self.total_steps, self.warmup_steps
        if c is not None and step >= c.step:
            return ph.lr_scale * continued_lr(
                step,
                from_step=c.step,
                from_lr=c.base_lr,
                peak_lr=peak,
                total_steps=total,
                warmup_steps=warmup,
                decay=s.decay,
                min_lr_ratio=s.min_lr_ratio,
            )
        return ph.lr_scale * lr_at(
            step, peak_lr=peak, total_steps=total, warmup_steps=warmup, decay=s.decay, min_lr_ratio=s.min_lr_ratio
        )

    def record(self, step: int) -> dict[str, Any]:
        """What the meta.json of a checkpoint at ``step`` records of the plan (``schedule``), so that a later resume
        rebuilds the checkpoint's own plan (vitlarge/plan/edits.py): the training images it was planned for, the
        `Continuation` and the `EpochCount`, if any, and the epochs done at ``step`` (which the rebuilt plan must
        give: an `EpochCount` that contradicts its step is refused, not trained on)."""
        c, e = self.continues, self.counted_from
        return {
            "num_train_examples": self.num_train_examples,
            "epoch": self.epoch_at(step),
            "continues": None if c is None else {"step": c.step, "base_lr": c.base_lr},
            "counted_from": None if e is None else {"step": e.step, "epoch": e.epoch},
        }

    def describe(self, step: int = 0) -> str:
        """The batch arithmetic of the phase ``step`` is in, and the run's step counts."""
        ph = self.phase_at(step)
        return (
            f"global batch {ph.global_batch} = {ph.micro_batch} (micro) x {ph.accum_steps} "
            f"(accumulation) x {self.world_size} (devices); {ph.steps_per_epoch} steps/epoch, "
            f"{self.total_steps} steps, {self.warmup_steps} warmup steps"
        )


def make_plan(
    cfg: Config, world_size: int, num_train_examples: int | None = None, counted_from: EpochCount | None = None
) -> Plan:
    """Derives each phase's accumulation and steps; raises UserError when a batch does not divide. ``counted_from``:
    the epochs a resume goes on from (`EpochCount`)."""
    n = num_train_examples or cfg.data.num_train_examples
    resolved = resolve_phases(cfg)
    phases = plan_phases(cfg, resolved, world_size, n)
    offset = 0.0
    if counted_from is not None:  # every boundary moves by the steps this plan's batches would have taken
        offset = counted_from.step - exact_step(phases, counted_from.epoch)
        phases = plan_phases(cfg, resolved, world_size, n, offset)
    t = cfg.train
    eval_every = 0
    if t.eval_every_epochs > 0:
        eval_every = max(1, epochs_to_steps(t.eval_every_epochs, phases[0].steps_per_epoch))
    return Plan(
        world_size=world_size,
        phases=phases,
        total_steps=max(1, phases[-1].end_step),
        warmup_steps=step_at_epoch(phases, cfg.schedule.warmup_epochs, offset),
        eval_every_steps=eval_every,
        num_train_examples=n,
        counted_from=counted_from,
    )


def evaluation_plan(cfg: Config, world_size: int, num_train_examples: int | None = None) -> Plan:
    """The plan that says which phase (size, crop, batches) evaluated each step, for an evaluation at
    ``world_size``. Phase boundaries do not depend on the world size; the batch arithmetic of training
    does, and does not bind an evaluation (every world size evaluates exactly): where the training batch
    does not divide over ``world_size`` processes, the plan of one process answers the same."""
    try:
        return make_plan(cfg, world_size, num_train_examples)
    except UserError:
        return make_plan(cfg, 1, num_train_examples)


def phase_config(cfg: Config, ph: Phase, fresh_at: int | None = None) -> Config:
    """A copy of ``cfg`` with the phase's image size, batches, crop scale and data seed, for what reads a whole
    config per phase (the dry run's model description). The loaders take the phase itself
    (`vitlarge.data.sources.train_spec`). ``fresh_at``: the stream starts at that step with no position to
    continue (see `stream_seed`)."""
    c = copy.deepcopy(cfg)
    c.data.image_size, c.data.crop_scale = ph.image_size, tuple(ph.crop_scale)
    c.train.global_batch, c.train.micro_batch = ph.global_batch, ph.micro_batch
    c.train.seed = stream_seed(cfg.train.seed, ph.index, fresh_at)
    return c


def stream_seed(seed: int, phase: int, fresh_at: int | None = None) -> int:
    """The data stream's seed: ``seed + 1000 * phase`` for a phase entered at its first step (as an
    uninterrupted run does), else, for a stream that starts afresh at step ``fresh_at`` because the
    checkpoint's position cannot be continued (another world size, phase list or release), a seed
    derived from ``(seed, phase, fresh_at)``: a never-used epoch order, not a replay of the phase's start."""
    if fresh_at is None:
        return seed + PHASE_SEED_STRIDE * phase
    return _derived_seed("stream", seed, phase, fresh_at)


def rng_seed(seed: int, rank: int, step: int = 0) -> int:
    """The seed of a rank's torch, numpy and python RNGs (dropout, Mixup, drop path) when a run starts at
    ``step`` without the checkpoint's RNG states (a fresh run: ``seed + rank``; after a change of world
    size: derived from ``(seed, step, rank)``, so the draws do not replay the run's first steps)."""
    if step == 0:
        return seed + rank
    return _derived_seed("rng", seed, step, rank)


def _derived_seed(kind: str, *parts: int) -> int:
    """A seed in DALI's and numpy's 31-bit range, hashed from ``parts`` (nearby inputs share no stream)."""
    digest = hashlib.sha256(":".join(map(str, (f"vitlarge-{kind}", *parts))).encode()).digest()
    return int.from_bytes(digest[:4], "little") % (2**31 - 1)
