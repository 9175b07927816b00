"""A resume that cannot continue the data position (another world size, phase list or release) starts
a never-used epoch order and fresh RNG draws from the step it resumes at, never a replay of the start.

Real DALI loaders over the demo digits, one process: the stream entered mid-phase without a state
differs from the phase's own beginning, is the same for the same step (every rank agrees on the file
order), and differs between two resume steps.
"""

from __future__ import annotations

import torch

from tests.helpers import ROOT
from vitlarge.config.load import load_recipe
from vitlarge.data import phased
from vitlarge.plan.plan import make_plan, rng_seed, stream_seed

CPU = torch.device("cpu")
DEMO = ROOT / "recipes" / "demo_digits.py"
N = 1437  # digits training images


def demo_cfg(data: str):
    c = load_recipe(DEMO)
    c.data.path, c.train.micro_batch, c.augment.mixup_alpha = data, 16, 0.0
    return c


def first_batches(cfg, plan, step: int, n: int = 2) -> list[torch.Tensor]:
    train = phased.PhasedLoaders(cfg, plan, 0, 1, CPU).enter(step)[0]
    return [next(train)[0] for _ in range(n)]


def test_a_stream_without_a_position_starts_a_fresh_order_at_its_step(demo_data):
    c = demo_cfg(demo_data)  # one phase: a recipe without train.phases
    plan = make_plan(c, 1, N)
    start = first_batches(c, plan, 0)
    assert all(torch.equal(a, b) for a, b in zip(start, first_batches(c, plan, 0)))  # the start is reproducible
    at_37 = first_batches(c, plan, 37)
    assert not any(torch.equal(a, b) for a, b in zip(at_37, start))  # not a replay of step 0
    assert all(torch.equal(a, b) for a, b in zip(at_37, first_batches(c, plan, 37)))  # same step, same stream
    assert not any(torch.equal(a, b) for a, b in zip(at_37, first_batches(c, plan, 38)))


def test_seeds_are_the_old_ones_at_a_phase_start_and_fresh_elsewhere():
    cfg = load_recipe(DEMO)
    seed = cfg.train.seed
    assert [stream_seed(seed, i) for i in range(3)] == [seed, seed + 1000, seed + 2000]  # uninterrupted runs
    assert [rng_seed(seed, r) for r in range(3)] == [seed, seed + 1, seed + 2]  # a fresh run, as before
    fresh = {stream_seed(seed, p, s) for p in range(3) for s in range(1, 200)}
    assert len(fresh) == 3 * 199 and not fresh & {seed + 1000 * i for i in range(100)}
    rng = {rng_seed(seed, r, s) for r in range(130) for s in (1, 500, 10_000)}
    assert len(rng) == 130 * 3 and all(0 <= x < 2**31 - 1 for x in fresh | rng)


def test_a_stream_started_afresh_continues_exactly_on_the_next_resume(demo_data):
    """After a world-size change the stream starts afresh at the resumed step; its checkpoints record that step,
    so the next resume at the same world size continues the same stream (not yet another fresh order)."""
    c = demo_cfg(demo_data)
    plan = make_plan(c, 1, N)
    train = phased.PhasedLoaders(c, plan, 0, 1, CPU).enter(37)[0]  # no position: fresh at step 37
    for _ in range(3):
        next(train)
    state = train.state()
    assert phased.DataState.read(state).fresh_at == 37
    rest = [next(train)[0] for _ in range(2)]
    resumed = phased.PhasedLoaders(c, plan, 0, 1, CPU, state=state).enter(40)[0]
    assert all(torch.equal(a, next(resumed)[0]) for a in rest)
    assert phased.DataState.read(resumed.state()).fresh_at == 37  # and its own checkpoints keep saying so
