"""The ``train.phases`` list of a recipe: its keys, its validation, and `progressive` to build one.

Checked with no world size (order, keys, sizes divisible by the patch size, batches): the list is part
of the config; `resolve_phases` fills in every key (a `PhaseEntry` with all of them given) and
`vitlarge.plan.phases.plan_phases` turns the resolved entries into steps for a world size.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vitlarge.config.schema import CROP_SCALE, IMAGE_SIZE, MAX_PHASES, PHASE_KEYS, Config, PhaseEntry
from vitlarge.errors import UserError


def patch_size(cfg: Config) -> int:
    """The model's patch size: ``model.kwargs['patch_size']``, else the ``patchN`` in the timm name."""
    if "patch_size" in cfg.model.kwargs:
        return int(cfg.model.kwargs["patch_size"])
    m = re.search(r"patch(\d+)", cfg.model.name)
    return int(m.group(1)) if m else 1


def _fix_size(size: int, patch: int) -> str:
    lo = max(patch, size // patch * patch)
    return f"use {lo} or {lo + patch}"


def resolve_phases(cfg: Config, origin: str = "config") -> list[PhaseEntry]:
    """The phases with every key filled in (carried over), validated: `PhaseEntry`s with every key given; a recipe
    without ``train.phases`` is one phase with its own values (validated by `vitlarge.config.checks.validate`)."""
    raw: list[Any] = list(cfg.train.phases)  # entries, or dicts a recipe wrote (before `validate` typed them)
    base: dict[str, Any] = dict(
        epoch=0.0,
        image_size=cfg.data.image_size,
        eval_size=None,
        global_batch=cfg.train.global_batch,
        micro_batch=cfg.train.micro_batch,
        crop_scale=tuple(cfg.data.crop_scale),
        lr_scale=1.0,
        lr=None,
        rect_val=cfg.data.rect_val,
    )
    if not raw:
        return [_resolved(dict(base, eval_size=base["image_size"]))]
    if len(raw) > MAX_PHASES:
        raise UserError(
            f"{origin}: train.phases holds {len(raw):,} entries, more than {MAX_PHASES:,}; a phase list names each "
            "change of size, batch or lr once"
        )
    out: list[dict[str, Any]] = []
    patch, prev = patch_size(cfg), base
    for i, p in enumerate(raw):
        key = f"train.phases[{i}]"
        if isinstance(p, PhaseEntry):
            p = p.to_dict()
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
        cur: dict[str, Any] = {**prev, "eval_size": None, "lr": None, **p}
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
            if name in ("image_size", "eval_size") and not IMAGE_SIZE.test(v):
                raise UserError(f"{origin}: {key}.{name}={v} must be {IMAGE_SIZE.words}, e.g. 224")
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
        if not (len(cs) == 2 and all(isinstance(x, (int, float)) for x in cs) and CROP_SCALE.test(*cs)):
            raise UserError(
                f"{origin}: {key}.crop_scale={cur['crop_scale']} must be {CROP_SCALE.words}, e.g. (0.35, 1.0)"
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
        if not isinstance(cur["rect_val"], bool):
            raise UserError(f"{origin}: {key}.rect_val={cur['rect_val']!r} must be True or False")
        if _odd_for_mixup(cfg, cur["micro_batch"]):
            raise UserError(f"{origin}: {key}.micro_batch={cur['micro_batch']}: {_MIXUP_EVEN} micro batch")
        if not out and e > 0:  # the recipe's own values until the first listed phase
            out.append(dict(base, crop_scale=tuple(base["crop_scale"])))
        out.append(cur)
        prev = cur
    return [_resolved(dict(p, eval_size=p["eval_size"] or p["image_size"])) for p in out]


def _resolved(values: dict[str, Any]) -> PhaseEntry:
    return PhaseEntry(**values, given=PHASE_KEYS)


_MIXUP_EVEN = "Mixup/CutMix need an even"


def _odd_for_mixup(cfg: Config, micro_batch: int) -> bool:
    """Whether Mixup/CutMix, which mix the images of a micro batch in pairs, are on and ``micro_batch`` is odd."""
    return (cfg.augment.mixup_alpha > 0 or cfg.augment.cutmix_alpha > 0) and micro_batch % 2 == 1


def check(cfg: Config, where: Callable[..., str]) -> None:
    """Validates the micro batches Mixup/CutMix take, the recipe's ``train.micro_batch`` (whatever the phases set)
    and each phase's, and the ``train.phases`` list (called by `vitlarge.config.checks.validate` and
    `check_read_back`). ``where(*keys)``: whom a line blames, the override that set one of ``keys`` or the recipe."""
    t = cfg.train
    if _odd_for_mixup(cfg, t.micro_batch):
        raise UserError(
            f"{where('train.micro_batch', 'augment.mixup_alpha', 'augment.cutmix_alpha')}: {_MIXUP_EVEN} "
            f"train.micro_batch, got {t.micro_batch}; use an even micro batch or set augment.mixup_alpha=0 "
            "augment.cutmix_alpha=0"
        )
    if t.phases:
        resolve_phases(
            cfg, where("train.phases", "train.epochs", "data.image_size", "train.global_batch", "train.micro_batch")
        )


def rect_val_anywhere(cfg: Config) -> bool:
    """Whether any phase validates rectangular batches (``data.rect_val`` or a phase's ``rect_val``)."""
    return any(p.rect_val for p in resolve_phases(cfg))


def final_rect_val(cfg: Config) -> bool:
    """Whether the last phase validates rectangular batches: how a finished run's final top-1 was measured."""
    return bool(resolve_phases(cfg)[-1].rect_val)  # resolved: a bool


def final_eval_size(cfg: Config) -> int:
    """The last phase's ``eval_size`` (the recipe's own without ``train.phases``): where a finished run's final top-1
    was measured, for what has no plan to ask (an export's config.json; an evaluation on data too small to plan)."""
    size = resolve_phases(cfg)[-1].eval_size
    assert size is not None, "a key of a resolved phase entry"
    return size


def entries(raw: Iterable[PhaseEntry | Mapping[str, Any]]) -> list[PhaseEntry]:
    """A phase list as `PhaseEntry`s: a recipe's dicts (checked by `check` first: their keys are `PHASE_KEYS`) or a
    meta.json's; TypeError for a dict with another key."""
    return [p if isinstance(p, PhaseEntry) else PhaseEntry.from_dict(p) for p in raw]


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
