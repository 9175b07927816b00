"""train.py with poisoned batches: a test-only entry point that wraps the batch source, nothing else.

    python tests/helpers/poison_train.py STEPS train.py-arguments...

``STEPS`` is ``"5"``, ``"5-8"`` or ``"5-"`` (open-ended): the optimizer steps (1-based, as logged)
whose micro-batches are replaced by inf on every rank, which makes fp16 overflow and the loss
non-finite. The wrapper counts micro-batches from the run's first step (these runs do not resume).
Used by tests/e2e/reliability/test_nonfinite.py to prove the skip logic and the NaN guard on real runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root


def poisoned_steps(spec: str) -> range:
    first, dash, last = spec.partition("-")
    if not dash:
        return range(int(first), int(first) + 1)
    return range(int(first), int(last) + 1 if last else 2**62)


class PoisonedBatches:
    """A batch source whose micro-batches of the ``steps`` (1-based optimizer steps) are all inf."""

    def __init__(self, source, steps: range, accum_steps: int):
        self.source, self.steps, self.accum_steps = source, steps, accum_steps
        self._micro = 0  # micro-batches handed out

    def __iter__(self):
        return self

    def __next__(self):
        images, labels = next(self.source)
        step = self._micro // self.accum_steps + 1
        self._micro += 1
        if step in self.steps:
            images = images.fill_(float("inf"))
        return images, labels

    def state(self):
        return self.source.state()

    def __getattr__(self, name):  # anything else (reset, close, ...) is the source's
        return getattr(self.source, name)


def main(argv: list[str]) -> int:
    import train
    from vitlarge.data import sources

    steps, real = poisoned_steps(argv[0]), sources.train_loader

    def train_loader(cfg, rank, world_size, *args, **kwargs):
        phase = kwargs.get("phase")  # the trainer's loaders are its phase's
        accum = phase.accum_steps if phase else cfg.train.global_batch // (cfg.train.micro_batch * world_size)
        return PoisonedBatches(real(cfg, rank, world_size, *args, **kwargs), steps, accum)

    sources.train_loader = train_loader  # vitlarge.data.phased looks it up on vitlarge.data.sources at call time
    return train.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
