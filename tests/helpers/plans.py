"""Plans and phase loaders built by hand, for unit tests of what consumes them (hooks, the trainer)."""

from __future__ import annotations

from vitlarge.config.schema import PHASE_KEYS, PhaseEntry
from vitlarge.plan.phases import Phase
from vitlarge.plan.plan import Plan


def one_phase_plan(world_size, global_batch, micro_batch, accum_steps, steps_per_epoch, total_steps, **kw) -> Plan:
    """A plan of one phase (a recipe without train.phases) with these figures; ``kw``: the other Plan fields."""
    phase = Phase(
        index=0,
        start_epoch=0.0,
        end_epoch=total_steps / steps_per_epoch,
        image_size=224,
        eval_size=224,
        global_batch=global_batch,
        micro_batch=micro_batch,
        accum_steps=accum_steps,
        crop_scale=(0.08, 1.0),
        lr_scale=1.0,
        lr=None,
        rect_val=False,
        steps_per_epoch=steps_per_epoch,
        start_step=0,
        end_step=total_steps,
        entry=PhaseEntry(0.0, 224, 224, global_batch, micro_batch, (0.08, 1.0), 1.0, None, False, PHASE_KEYS),
    )
    return Plan(world_size=world_size, phases=(phase,), total_steps=total_steps, **kw)


class OnePhaseLoaders:
    """What the trainer asks of `vitlarge.data.phased.PhasedLoaders`, for one phase of given loaders."""

    def __init__(self, train, val):
        self.train, self.val, self.entered = train, val, False

    def changes_at(self, step: int) -> bool:
        return not self.entered

    def enter(self, step: int):
        self.entered = True
        return self.train, self.val
