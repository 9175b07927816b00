"""Test-only fault injection, switched on by environment variables and inert otherwise.

``VITLARGE_TEST_POISON_STEPS="5"`` or ``"5-8"`` or ``"5-"`` (open-ended): the optimizer steps (1-based,
as logged) whose micro-batches are replaced by inf on every rank, which makes fp16 overflow and the
loss non-finite. Used by the reliability tests to prove the skip logic and the NaN guard on real runs.
"""

from __future__ import annotations

import os

ENV = "VITLARGE_TEST_POISON_STEPS"


def poisoned_steps(spec: str | None = None) -> range | None:
    spec = os.environ.get(ENV, "") if spec is None else spec
    if not spec:
        return None
    first, _, last = spec.partition("-")
    if not _:
        return range(int(first), int(first) + 1)
    return range(int(first), int(last) + 1 if last else 2**62)


def poison_batches(next_batch, step: int, steps: range | None):
    """Wraps a batch source so that the batches of ``step`` (1-based) are all inf."""
    if steps is None or step not in steps:
        return next_batch

    def poisoned():
        images, labels = next_batch()
        return images.fill_(float("inf")), labels

    return poisoned
