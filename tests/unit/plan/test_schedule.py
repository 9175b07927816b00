"""vitlarge/plan/schedule.py: the lr is a pure function of the optimizer step."""

import math

import pytest

from vitlarge.plan.schedule import lr_at

PEAK = 1.8e-2


def lrs(total=100, warmup=10, decay="linear", min_lr_ratio=0.0, peak=PEAK):
    return [
        lr_at(s, peak_lr=peak, total_steps=total, warmup_steps=warmup, decay=decay, min_lr_ratio=min_lr_ratio)
        for s in range(total + 1)
    ]


@pytest.mark.parametrize("decay", ["linear", "cosine", "constant"])
def test_warmup_is_linear_and_starts_above_zero(decay):
    v = lrs(warmup=10, decay=decay)
    assert v[0] == pytest.approx(PEAK / 10)
    steps = [b - a for a, b in zip(v[:10], v[1:10])]
    assert all(d == pytest.approx(PEAK / 10) for d in steps)
    assert all(lr > 0 for lr in v[:10])


@pytest.mark.parametrize("warmup", [29, 57, 5850, 7])  # 0.018 * w / w != 0.018 in floating point for 29, 57
def test_warmup_reaches_the_peak_exactly(warmup):
    at = lambda s: lr_at(s, peak_lr=PEAK, total_steps=2 * warmup, warmup_steps=warmup)
    assert at(warmup - 1) == PEAK  # the last warmup step
    assert at(warmup) == PEAK  # decay starts from the peak
    assert at(warmup - 2) < PEAK


def test_linear_decay_reaches_min_lr_at_total_steps():
    v = lrs(total=100, warmup=10, decay="linear", min_lr_ratio=0.1)
    assert v[100] == pytest.approx(PEAK * 0.1)
    assert v[55] == pytest.approx(PEAK * 0.1 + PEAK * 0.9 * 0.5)  # halfway through the decay
    decay = v[10:]
    assert all(b < a for a, b in zip(decay, decay[1:]))
    diffs = [a - b for a, b in zip(decay, decay[1:])]
    assert max(diffs) == pytest.approx(min(diffs))  # a straight line


def test_linear_decay_to_zero_and_clamped_after_the_end():
    at = lambda s: lr_at(s, peak_lr=PEAK, total_steps=100, warmup_steps=10)
    assert at(100) == 0.0
    assert at(150) == 0.0  # max_steps beyond the schedule does not go negative


def test_cosine_midpoint_and_end():
    at = lambda s: lr_at(s, peak_lr=PEAK, total_steps=110, warmup_steps=10, decay="cosine", min_lr_ratio=0.2)
    floor = 0.2 * PEAK
    assert at(10) == pytest.approx(PEAK)
    assert at(60) == pytest.approx(floor + (PEAK - floor) / 2)
    assert at(35) == pytest.approx(floor + (PEAK - floor) * 0.5 * (1 + math.cos(math.pi / 4)))
    assert at(110) == pytest.approx(floor)
    assert at(35) - at(36) < at(59) - at(60)  # slow at first, fastest in the middle


def test_constant_stays_at_peak():
    v = lrs(total=50, warmup=5, decay="constant", min_lr_ratio=0.5)
    assert v[5:] == [PEAK] * 46


def test_no_warmup_starts_at_peak():
    v = lrs(total=20, warmup=0, decay="linear")
    assert v[0] == PEAK
    assert v[10] == pytest.approx(PEAK / 2)
    assert v[20] == 0.0


def test_pure_function_of_the_step():
    kw = dict(peak_lr=PEAK, total_steps=11700, warmup_steps=5850, decay="linear")
    first = [lr_at(s, **kw) for s in range(0, 11700, 97)]
    lr_at(11699, **kw)
    shuffled = {s: lr_at(s, **kw) for s in reversed(range(0, 11700, 97))}  # any order: resume = restore the step
    assert [shuffled[s] for s in range(0, 11700, 97)] == first


def test_vit_b16_shape():
    kw = dict(peak_lr=PEAK, total_steps=11700, warmup_steps=5850, decay="linear")
    assert lr_at(2924, **kw) == pytest.approx(PEAK / 2)
    assert lr_at(5849, **kw) == PEAK
    assert lr_at(8775, **kw) == pytest.approx(PEAK / 2)


def test_unknown_decay():
    with pytest.raises(ValueError, match="step"):
        lr_at(50, peak_lr=1.0, total_steps=100, warmup_steps=10, decay="step")
