"""Stop a run whose loss stays non-finite, with a message that says what to do.

Runs on ALL ranks: every rank receives the same ``train_loss`` (contract of vitlarge.events), so every
rank raises `StopTraining` at the same step and none is left waiting in a collective.

What counts: a step whose ``train_loss`` is nan or inf. An fp16 overflow step (``skipped=True``)
with a finite loss is the loss scaler doing its job, not divergence: it does not count, and like
any finite loss it resets the counter. Without a loss scaler (``train.precision`` bf16 or fp32) a
skipped step means the gradients themselves were non-finite and nothing will lower a scale and
retry: it counts, even when the loss is finite (a huge lr drives weights to where the loss is a
finite 1e8 but every gradient is nan, and the run would otherwise skip every step to the end).
"""

from __future__ import annotations

import math

from vitlarge.events import Hook, RunInfo, StepMetrics, StopTraining


class NanGuardHook(Hook):
    """Raises `StopTraining` once the loss has been non-finite for ``patience`` consecutive steps."""

    def __init__(self, patience: int):
        if patience < 1:
            raise ValueError(f"nan patience must be >= 1 step, got {patience}")
        self.patience = patience
        self._bad_since: int | None = None  # first step of the current non-finite streak
        self._bad_count = 0
        self._last_finite: tuple[int, float] | None = None  # (step, loss)
        self._checkpoints: list[tuple[int, str]] = []  # (step, path), in the order written
        self._start_step = 0
        self._skips_count = False  # True without a loss scaler: a skipped step is a non-finite gradient

    def on_train_start(self, run: RunInfo) -> None:
        self._start_step = run.start_step
        self._skips_count = run.precision != "fp16"

    def on_checkpoint(self, run: RunInfo, step: int, path: str) -> None:
        self._checkpoints.append((step, path))

    def on_step_end(self, run: RunInfo, m: StepMetrics) -> None:
        step, loss = m.step, m.train_loss
        if math.isfinite(loss) and not (self._skips_count and m.skipped):
            self._bad_since, self._bad_count = None, 0
            self._last_finite = (step, loss)
            return
        if self._bad_since is None:
            self._bad_since = step
        self._bad_count += 1
        if self._bad_count >= self.patience:
            raise StopTraining(self._message(step, self._bad_since))

    def _message(self, step: int, first: int) -> str:
        if self._last_finite is None:
            finite = f"no finite loss since this run started at step {self._start_step}"
        else:
            finite = f"last finite loss {self._last_finite[1]:.4f} at step {self._last_finite[0]}"
        # A checkpoint written after the streak began may hold diverged weights; name the last one
        # from before it.
        good = [p for s, p in self._checkpoints if s < first]
        if good:
            ckpt = good[-1]
        elif self._start_step > 0:
            ckpt = f"none written by this run; it resumed from the checkpoint at step {self._start_step}"
        else:
            ckpt = "none"
        what, fix = (
            ("loss or gradients were", "lower the lr")
            if self._skips_count
            else ("loss was", "lower the lr or use bf16")
        )
        return f"{what} non-finite for steps {first}..{step}; {finite}; {fix}; last good checkpoint: {ckpt}"
