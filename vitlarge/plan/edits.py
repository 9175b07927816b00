"""What an edit of the recipe between two runs does to the schedule, said when the run resumes.

A checkpoint records the config it was trained under (meta.json's ``config``) and what its plan needs beyond it
(``schedule``, `vitlarge.plan.plan.Plan.record`: the training images it was planned for, and its `Continuation`).
`resume_plan` rebuilds the checkpoint's own plan from them and compares it with this recipe's:

* nothing of the schedule changed (the same lr at every step, the same step counts; another world size or micro
  batch changes neither): the run continues the checkpoint's plan, continuation included, and nothing is said
  beyond the resume's own lines: it resumes exactly;
* something changed (``train.epochs``, ``train.global_batch``, ``train.phases``, warmup, decay, ``optim.lr``, the
  data set's size): one warning line naming the edits, then one line each, old -> new, for the global batch, steps
  per epoch, total and warmup steps that differ, and the lr at the resume step in both plans with what the run
  does from there. Where the two lrs differ, ``schedule.on_edit=continue`` (the default) keeps the checkpoint's lr
  and re-plans the rest of the warmup or decay from it (a `Continuation`: no jump), ``schedule.on_edit=recipe``
  takes this recipe's (timm's and torchtitan's behaviour when their scheduler is rebuilt from an edited config).
  Where the global batch or the data set's size changed the epochs done at the resume step differ between the
  plans: the run counts on from the checkpoint's (an `EpochCount`), so the epoch never jumps back and the run ends
  when ``train.epochs`` passes of the loader are done, not after this recipe's step count at the new batch.

The lr stays a pure function of the step, the recipe and meta.json: the continuation is recorded in every later
checkpoint, so a requeue of the resumed run rebuilds the same plan (nothing changed then) and an older checkpoint
without ``schedule`` is planned from the data set's size as it is now.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, replace

from vitlarge.config.phase_list import entries
from vitlarge.config.schema import Config
from vitlarge.errors import UserError
from vitlarge.plan.plan import Continuation, EpochCount, Plan, make_plan
from vitlarge.text import plural

SCHEDULE_KEYS = (
    "train.epochs",
    "train.global_batch",
    "train.phases",
    "schedule.warmup_epochs",
    "schedule.decay",
    "schedule.min_lr_ratio",
    "optim.lr",
)
"""The config keys the lr at each step and the step counts follow (with the data set's size)."""
PLANNED_WITH = (*SCHEDULE_KEYS, "train.micro_batch")
"""What the checkpoint's plan is rebuilt with (the micro batch: only that its batches divide)."""


@dataclass(frozen=True)
class ResumedPlan:
    """The plan a resumed run continues with, and the lines that say how its schedule differs from the checkpoint's
    (empty: nothing of it changed, the resume is exact)."""

    plan: Plan
    lines: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return not self.lines


def checkpoint_config(cfg: Config, saved: dict) -> Config:
    """A copy of ``cfg`` with the `PLANNED_WITH` keys of ``saved`` (meta.json's ``config``; a key it lacks keeps
    ``cfg``'s). TypeError or ValueError for a phase list of another form."""
    old = copy.deepcopy(cfg)
    for key in PLANNED_WITH:
        section, name = key.split(".")
        values = saved.get(section)
        if not isinstance(values, dict) or name not in values:
            continue
        value = values[name]
        setattr(getattr(old, section), name, entries(value or []) if key == "train.phases" else value)
    return old


def checkpoint_plan(
    cfg: Config, saved: dict, record: dict, world_size: int, num_train_examples: int
) -> tuple[Config, Plan] | None:
    """The config and plan a checkpoint was trained under (``saved``: meta.json's ``config``, ``record``: its
    ``schedule``; ``num_train_examples``: the data set's now, for a checkpoint that does not record it), or None
    where this vitlarge cannot plan them (a phase list of another release)."""
    try:
        old = checkpoint_config(cfg, saved)
        n = record.get("num_train_examples") or num_train_examples
        e = record.get("counted_from")
        counted = EpochCount(e["step"], e["epoch"]) if e else None
        try:
            plan = make_plan(old, world_size, n, counted)
        except UserError:  # its batches do not divide here: the step counts do not depend on the world size
            plan = make_plan(old, 1, n, counted)
    except (UserError, TypeError, ValueError, KeyError, AttributeError):
        return None
    c = record.get("continues")
    if c:
        plan = replace(plan, continues=Continuation(c["step"], c["base_lr"]))
    return old, plan


def resume_plan(cfg: Config, plan: Plan, path, saved: dict, record: dict, step: int, world_size: int) -> ResumedPlan:
    """The plan a run resumed at optimizer step ``step`` from checkpoint ``path`` continues with (``plan``: this
    recipe's; ``saved``, ``record``: the checkpoint's meta.json ``config`` and ``schedule``; ``world_size``: the
    processes that wrote it), and what changed (see the module docstring)."""
    found = checkpoint_plan(cfg, saved, record, world_size, plan.num_train_examples)
    if found is None:
        return ResumedPlan(plan)
    old_cfg, old = found
    recorded = record.get("epoch")
    if recorded is not None and not math.isclose(old.epoch_at(step), recorded, rel_tol=1e-9, abs_tol=1e-9):
        raise UserError(
            f"{path}/meta.json's schedule gives epoch {old.epoch_at(step):.4g} at step {step}, not the {recorded:.4g} "
            "it records (schedule.counted_from contradicts its step); move the checkpoint aside to resume from an "
            "earlier one",
            same_on_all_ranks=True,
        )
    counted = _counted(cfg, plan, old, step)
    new = _continued(cfg, counted, old_cfg, old, step)
    if _curve(old_cfg, old) == _curve(cfg, new):
        return ResumedPlan(new)
    return ResumedPlan(new, tuple(_lines(cfg, new, counted, old_cfg, old, step, path)))


def frozen_lr_line(cfg: Config, plan: Plan, step: int, path) -> str | None:
    """One warning line when ``plan`` (the one a run resumed at ``step`` from checkpoint ``path`` continues with)
    trains every step left at lr 0 because of a recorded continuation from lr 0, else None. A finished run extended
    under ``schedule.on_edit=continue`` makes one (its resume says so once); a requeue then resumes exactly with no
    other line, and a meta.json edited to hold one looks the same: each resume says it, so neither goes unsaid."""
    c = plan.continues
    if c is None or c.base_lr != 0 or step >= plan.total_steps:
        return None
    if plan.lr_at(cfg, step) != 0 or plan.lr_at(cfg, plan.total_steps - 1) != 0:
        return None
    return (
        f"warning: {path}'s meta.json continues the lr from 0 at step {c.step + 1} (schedule.continues): the "
        f"{plural(plan.total_steps - step, 'step')} left train at lr 0; resume with schedule.on_edit=recipe to take "
        "this recipe's lr"
    )


def finished_line(plan: Plan, step: int, path) -> str | None:
    """One warning line when ``plan`` (the one a run resumed at ``step`` from checkpoint ``path`` continues with) has
    no step left to train, else None: the run then ends at once, and says why rather than exiting 0 in silence."""
    if step < plan.total_steps:
        return None
    return (
        f"warning: {path} is at step {step} and this run's plan ends at step {plan.total_steps} (epoch "
        f"{plan.epoch_at(plan.total_steps):.2f}): nothing is left to train; raise train.epochs to train on"
    )


def _counted(cfg: Config, plan: Plan, old: Plan, step: int) -> Plan:
    """``plan``, counting its epochs on from those the checkpoint's plan has after ``step`` steps: the checkpoint's
    own `EpochCount` where it still gives them (a requeue), else none where the recipe's plan gives them (no batch
    or data set size edit before ``step``), else a new one at ``step`` (an edit of either: an epoch stays one pass
    of the loader, so the run ends when ``train.epochs`` passes are done, not after its steps at the new batch)."""
    was = old.epoch_at(step)
    candidates = [old.counted_from] if old.counted_from is not None else []
    for counted in [*candidates, None]:
        p = replace(plan, counted_from=None) if counted is None else _recount(cfg, plan, counted)
        if math.isclose(p.epoch_at(step), was, rel_tol=1e-12, abs_tol=1e-12):
            return p
    return _recount(cfg, plan, EpochCount(step, was))


def _recount(cfg: Config, plan: Plan, counted: EpochCount) -> Plan:
    return replace(make_plan(cfg, plan.world_size, plan.num_train_examples, counted), continues=plan.continues)


def _continued(cfg: Config, plan: Plan, old_cfg: Config, old: Plan, step: int) -> Plan:
    """``plan``, continuing the lr the checkpoint's plan has at ``step`` where ``schedule.on_edit=continue`` and
    this recipe's would differ there: the checkpoint's own continuation where it still gives that lr (a requeue),
    else none where the recipe's plan gives it, else a new one from ``step``. A phase with its own ``lr`` segment
    at ``step`` keeps it (the recipe states that lr)."""
    if cfg.schedule.on_edit == "recipe":
        return plan
    was = old.lr_at(old_cfg, step)
    candidates = [replace(plan, continues=old.continues)] if old.continues is not None else []
    for p in [*candidates, plan]:
        if p.lr_at(cfg, step) == was:
            return p
    ph = plan.phase_at(step)
    if ph.lr is not None or ph.lr_scale <= 0:
        return plan
    return replace(plan, continues=Continuation(step, was / ph.lr_scale))


def _curve(cfg: Config, plan: Plan) -> tuple:
    """Everything the lr at each step and the step counts follow, free of the world size (micro batch and
    accumulation change neither): two plans with equal curves give the same lr at every step."""
    phases = tuple(
        (p.start_step, p.end_step, p.global_batch, p.steps_per_epoch, p.lr_scale, None if p.lr is None else tuple(p.lr))
        for p in plan.phases
    )
    s = cfg.schedule
    return (cfg.optim.lr, s.decay, s.min_lr_ratio, plan.total_steps, plan.warmup_steps, plan.continues, phases)


def _value(cfg: Config, key: str):
    section, name = key.split(".")
    return json.loads(json.dumps(cfg.to_dict()[section][name], default=str))


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def edited_keys(old_cfg: Config, cfg: Config, old: Plan, plan: Plan) -> list[str]:
    """``key old -> new`` for each `SCHEDULE_KEYS` setting (and the data set's size) that differs."""
    out = []
    for key in SCHEDULE_KEYS:
        was, now = _value(old_cfg, key), _value(cfg, key)
        if was != now:
            out.append(f"{key} edited" if key == "train.phases" else f"{key} {_shown(was)} -> {_shown(now)}")
    if old.num_train_examples != plan.num_train_examples:
        out.append(f"training images {old.num_train_examples} -> {plan.num_train_examples}")
    return out


def _rest(cfg: Config, plan: Plan, step: int, replanned: bool = False) -> str:
    """What the lr does after ``step`` (0-based) in ``plan``, in the console's 1-based step numbers; ``replanned``:
    from a `Continuation` at ``step``."""
    s = cfg.schedule
    floor, total = cfg.optim.lr * s.min_lr_ratio, plan.total_steps
    how = f", re-planned from step {step + 1}," if replanned else ""
    if step < plan.warmup_steps:
        warmup = f"the warmup{how} to {cfg.optim.lr:.3e} at step {plan.warmup_steps}"
        if s.decay == "constant":
            return f"{warmup}, then constant until step {total}"
        return f"{warmup}, then the {s.decay} decay to {floor:.3e} at step {total}"
    if s.decay == "constant":
        return f"constant until step {total}"
    return f"the {s.decay} decay{how} to {floor:.3e} at step {total}"


def _lines(cfg: Config, new: Plan, plan: Plan, old_cfg: Config, old: Plan, step: int, path) -> list[str]:
    """The warning line and one line per consequence (see the module docstring); ``plan``: this recipe's, its epochs
    counted as the run counts them, so its lr is the one ``schedule.on_edit=recipe`` takes."""
    edits = edited_keys(old_cfg, cfg, old, plan)
    if not edits and old.continues is not None and new.continues != old.continues:
        edits = [f"the lr re-planned at step {old.continues.step + 1} by an earlier resume is dropped"]
    named = f" ({', '.join(edits)})" if edits else ""
    lines = [f"warning: the schedule changed since {path}{named}; this run continues it as follows:"]
    a, b = old.phase_at(step), new.phase_at(step)
    for what, was, now in (
        ("global batch", a.global_batch, b.global_batch),
        ("steps per epoch", a.steps_per_epoch, b.steps_per_epoch),
        ("total steps", old.total_steps, new.total_steps),
        ("warmup steps", old.warmup_steps, new.warmup_steps),
    ):
        if was != now and not (what == "warmup steps" and max(was, now) <= step):  # a warmup done in both: moot
            lines.append(f"  {what} {was} -> {now}")
    was, recipe, now = old.lr_at(old_cfg, step), plan.lr_at(cfg, step), new.lr_at(cfg, step)
    at = f"  lr at step {step + 1}:"
    floor = cfg.optim.lr * cfg.schedule.min_lr_ratio
    if new.continues is not None and new.continues.step == step and new.continues != old.continues:
        ended = f" (its schedule ended at step {old.total_steps})" if step >= old.total_steps else ""
        if ended and step >= new.warmup_steps and math.isclose(was, floor, rel_tol=1e-9, abs_tol=1e-12 * cfg.optim.lr):
            lines.append(
                f"{at} {was:.3e} in the checkpoint's plan{ended}, {recipe:.3e} in this recipe's; the run keeps "
                f"{was:.3e} (schedule.on_edit=continue): the {plural(new.total_steps - step, 'step')} added train at "
                f"that lr; schedule.on_edit=recipe takes {recipe:.3e} there, then {_rest(cfg, new, step)} (a warm "
                "restart)"
            )
            return lines
        lines.append(
            f"{at} {was:.3e} in the checkpoint's plan{ended}, {recipe:.3e} in this recipe's; the run keeps {was:.3e} "
            f"(schedule.on_edit=continue; schedule.on_edit=recipe would take {recipe:.3e}), then "
            f"{_rest(cfg, new, step, replanned=True)}"
        )
    elif was == now:
        lines.append(f"{at} {now:.3e} in both plans, then {_rest(cfg, new, step)}")
    else:
        ph = new.phase_at(step)
        why = f"phase {ph.index}'s own lr segment" if ph.lr is not None else "schedule.on_edit=recipe"
        lines.append(f"{at} {was:.3e} -> {now:.3e} ({why}: this recipe's lr there), then {_rest(cfg, new, step)}")
    return lines
