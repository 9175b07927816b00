"""Learning rate as a pure function of the optimizer step, so resuming is restoring the step."""

from __future__ import annotations

import math


def lr_at(
    step: int, *, peak_lr: float, total_steps: int, warmup_steps: int, decay: str = "linear", min_lr_ratio: float = 0.0
) -> float:
    """The lr for optimizer step ``step`` (0-based: the step about to be taken).

    Linear warmup from ``peak_lr / warmup_steps`` to ``peak_lr`` over ``warmup_steps`` steps, then
    ``decay`` (``linear``, ``cosine`` or ``constant``) to ``min_lr_ratio * peak_lr`` at ``total_steps``.
    Warmup starts above zero so the first step already moves the weights.
    """
    if step < warmup_steps:
        return peak_lr * ((step + 1) / warmup_steps)  # the ratio is exactly 1.0 at the last warmup step
    floor = peak_lr * min_lr_ratio
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if decay == "linear":
        return floor + (peak_lr - floor) * (1.0 - progress)
    if decay == "cosine":
        return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if decay == "constant":
        return peak_lr
    raise ValueError(f"unknown decay {decay!r}")


def continued_lr(
    step: int,
    *,
    from_step: int,
    from_lr: float,
    peak_lr: float,
    total_steps: int,
    warmup_steps: int,
    decay: str = "linear",
    min_lr_ratio: float = 0.0,
) -> float:
    """The lr for optimizer step ``step >= from_step`` of a schedule re-planned at ``from_step`` to go on from
    ``from_lr`` (the lr a run had there) instead of jumping to `lr_at`'s value: what a resume under an edited
    schedule uses (``schedule.on_edit=continue``, vitlarge/plan/edits.py).

    Inside the warmup: a straight line from ``from_lr`` to ``peak_lr`` at ``warmup_steps``, then `lr_at`'s decay.
    After it: the decay from ``from_lr`` to ``min_lr_ratio * peak_lr`` at ``total_steps`` along the same curve:
    ``linear`` a straight line; ``cosine`` the rest of the cosine from the point where it has ``from_lr``,
    stretched over the steps left (a cosine from ``from_lr`` itself where that lies outside the peak-to-floor
    range); ``constant`` holds ``from_lr``. Equal to ``from_lr`` at ``from_step``, and to `lr_at`'s floor from
    ``total_steps`` on."""
    if from_step < warmup_steps:
        if step < warmup_steps:
            return from_lr + (peak_lr - from_lr) * (step - from_step) / (warmup_steps - from_step)
        return lr_at(
            step,
            peak_lr=peak_lr,
            total_steps=total_steps,
            warmup_steps=warmup_steps,
            decay=decay,
            min_lr_ratio=min_lr_ratio,
        )
    floor = peak_lr * min_lr_ratio
    t = min(1.0, (step - from_step) / max(1, total_steps - from_step))
    if decay == "linear":
        return from_lr + (floor - from_lr) * t
    if decay == "cosine":
        ratio = (from_lr - floor) / (peak_lr - floor) if peak_lr > floor else -1.0
        if 0.0 <= ratio <= 1.0:
            p0 = math.acos(2.0 * ratio - 1.0) / math.pi  # where the recipe's cosine has from_lr
            return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * (p0 + (1.0 - p0) * t)))
        return floor + (from_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * t))
    if decay == "constant":
        return from_lr
    raise ValueError(f"unknown decay {decay!r}")
