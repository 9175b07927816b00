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
