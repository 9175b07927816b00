"""Print how the global batch is made and how long the run is, once, at train start.

The counterpart of the original Colossal-AI ViT example's ``TotalBatchsizeHook``. Main rank only;
writes through the ``logging`` logger ``"vitlarge"`` at INFO, so the trainer's logging setup
decides where it goes.
"""

from __future__ import annotations

import logging

from vitlarge.events import Hook, RunInfo

log = logging.getLogger("vitlarge")


class TotalBatchHook(Hook):
    """Logs ``total batch size = G = micro (micro) x accum (accumulation) x world (devices)``."""

    def on_train_start(self, run: RunInfo) -> None:
        if not run.is_main:
            return
        p = run.plan
        ph = p.phase_at(run.start_step)  # the phase this run starts (or resumes) in
        log.info(
            "total batch size = %d = %d (micro) x %d (accumulation) x %d (devices)",
            ph.global_batch,
            ph.micro_batch,
            ph.accum_steps,
            p.world_size,
        )
        if ph.global_batch != ph.micro_batch * ph.accum_steps * p.world_size:
            # The config validates this; a mismatch here means the Plan was built wrongly.
            log.warning("the plan is inconsistent: global_batch != micro_batch x accum_steps x world_size")
        log.info(
            "steps per epoch = %d, total steps = %d (%.1f epochs), warmup steps = %d (%.1f epochs)",
            ph.steps_per_epoch,
            p.total_steps,
            p.epoch_at(p.total_steps),
            p.warmup_steps,
            p.epoch_at(p.warmup_steps),
        )
        if run.end_step < p.total_steps:
            log.info(
                "train.max_steps=%d: this run stops at step %d of the schedule's %d",
                run.end_step,
                run.end_step,
                p.total_steps,
            )
        if run.start_step > 0:
            log.info("resuming at step %d of %d", run.start_step, run.end_step)
