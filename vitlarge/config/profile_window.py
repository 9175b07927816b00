"""``train.profile_steps``: the ``START-END`` window of optimizer steps the profiler records, parsed and checked as
far as the config alone tells (`vitlarge.train.profile` checks it against the plan and records it)."""

from __future__ import annotations

import re
from collections.abc import Callable

from vitlarge.config.schema import TrainConfig
from vitlarge.errors import UserError

MAX_PROFILE_STEPS = 20
"""The longest ``train.profile_steps`` window: a ViT-L step with accumulation records ~10^5 events per rank,
all held in host memory until the window ends and then written as one JSON file per rank."""


def parse_step_window(text: str) -> tuple[int, int]:
    """``"START-END"`` (``train.profile_steps``) as ``(START, END)``; ValueError unless two non-negative integers
    joined by a dash. Which windows are allowed is `validate`'s (START >= 1, END >= START)."""
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if match is None:
        raise ValueError(f"not START-END: {text!r}")
    return int(match[1]), int(match[2])


def check_profile_window(t: TrainConfig, where: Callable[..., str]) -> None:
    """``train.profile_steps``: a window of optimizer steps inside the run, as far as the config alone tells (the
    plan's own last step is checked with the plan: `vitlarge.train.profile.check_window`)."""
    if t.profile_steps is None:
        return
    item, origin = f"train.profile_steps={t.profile_steps}", where("train.profile_steps")
    try:
        start, end = parse_step_window(t.profile_steps)
    except ValueError:
        raise UserError(
            f"{origin}: {item} is not a window START-END of optimizer steps; write it like "
            "train.profile_steps=100-105 (1-based, both ends included) or train.profile_steps=none"
        ) from None
    if end < start:
        raise UserError(
            f"{origin}: {item} ends before it starts; write the first step first, like train.profile_steps={end}-{start}"
        )
    if start < 1:
        raise UserError(
            f"{origin}: {item} starts at step {start}, but optimizer steps count from 1; write it like "
            f"train.profile_steps=1-{max(1, end)}"
        )
    if end - start + 1 > MAX_PROFILE_STEPS:
        raise UserError(
            f"{origin}: {item} records {end - start + 1} steps; a window holds at most {MAX_PROFILE_STEPS} (every "
            f"event of every rank stays in host memory until the window ends), like "
            f"train.profile_steps={start}-{start + MAX_PROFILE_STEPS - 1}"
        )
    if t.max_steps and end > t.max_steps:
        raise UserError(
            f"{where('train.profile_steps', 'train.max_steps')}: {item} ends after step {t.max_steps}, the run's last "
            f"(train.max_steps={t.max_steps}); end the window by step {t.max_steps} or raise train.max_steps"
        )
