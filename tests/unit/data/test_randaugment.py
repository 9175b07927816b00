"""vitlarge.data.randaugment against timm: the same ops and magnitudes, real DALI. The per-op probability, through
a RandAugment pipeline (seconds to build): tests/e2e/test_dali_long.py."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from timm.data import auto_augment as timm_aa

from vitlarge.data import randaugment as ra
from vitlarge.errors import UserError

SPECS = ["rand-m9-n2", "rand-m9-mstd0.5-inc1", "rand-m7-n3-mmax15-p0.7", "rand-m12-n1-mstd101"]


def dali_arg(name: str, param) -> float:
    """A DALI op parameter in timm's units (the argument timm's level_to_arg returns)."""
    p = np.asarray(param)
    base = name.replace("Increasing", "")
    if base == "Posterize":
        return float(bin(int(p)).count("1"))  # mask of kept high bits -> bits kept
    if base == "Sharpness":
        return float((p[1, 1] - 5 / 13) / (8 / 13))  # kernel (1 - f) * blur + f * identity -> f
    if base in ("ShearX", "TranslateXRel"):
        return float(p[0])
    if base in ("ShearY", "TranslateYRel"):
        return float(p[1])
    return float(p)


def dali_args(s, name, aug, level: float) -> set[float]:
    """What the DALI augmentation does at ``level`` on timm's scale, both signs for signed ops."""
    if aug.mag_range is None:
        return set()
    mag = float(aug.mag_range[round(level * ra.STEPS)])
    signs = (1, -1) if aug.randomly_negate else (1,)
    return {round(dali_arg(name, aug.mag_to_param(sign * mag)), 4) for sign in signs}


def timm_args(op, level: float) -> set[float]:
    if op.level_fn is None:
        return set()
    out = set()
    for coin in (0.0, 1.0):  # timm's _randomly_negate: random.random() > 0.5 negates
        with mock.patch.object(timm_aa.random, "random", return_value=coin):
            out.add(round(float(op.level_fn(level, op.hparams)[0]), 4))
    return out


@pytest.mark.parametrize("text", SPECS)
def test_ops_magnitudes_and_probability_equal_timms(text):
    s = ra.spec(text)
    timm = timm_aa.rand_augment_transform(text, {})
    table = ra.op_table(s)
    assert [name for name, _ in table] == [op.name for op in timm.ops]
    assert timm.num_layers == s.n and timm.choice_weights is None  # uniform choice with replacement
    upper = s.upper
    for (name, aug), op in zip(table, timm.ops):
        assert (op.prob, op.magnitude, op.magnitude_std, op.magnitude_max or 10) == (s.p, s.m, s.mstd, upper)
        for level in sorted({0.0, 1.0, 2.5, 5.0, min(s.m, upper), 9.0, 10.0, float(upper)}):
            if level <= upper:
                assert dali_args(s, name, aug, level) == timm_args(op, level), (text, name, level)


def test_deits_string_is_parsed_as_timm_does():
    assert ra.spec("rand-m9-mstd0.5-inc1") == ra.RandAugmentSpec(n=2, m=9, p=0.5, mstd=0.5, mmax=0, inc=True)
    assert ra.spec("rand-m9-n2") == ra.spec((2, 9)) == ra.RandAugmentSpec(n=2, m=9)
    assert math.isinf(ra.spec("rand-m9-mstd101").mstd)  # timm: > 100 means uniform in 0..m
    assert ra.spec(None) is None and ra.spec("") is None


@pytest.mark.parametrize(
    "text, part",
    [
        ("rand-m9-w0", "'w0'"),
        ("rand-m9-tweights", "'tweights'"),
        ("rand-x9", "'x9'"),
        ("rand-m", "'m'"),
        ("rand-m9.5", "'m9.5'"),
        ("rand-m9-inc2", "'inc2'"),
        ("rand-m9-p1.5", "'p1.5'"),
        ("rand-m9-mstd", "'mstd'"),
    ],
)
def test_unknown_or_malformed_parts_are_one_line_errors_naming_the_part(text, part):
    with pytest.raises(UserError) as e:
        ra.spec(text)
    msg = str(e.value)
    assert msg.startswith(f"randaugment={text!r}: part {part}") and "rand-m9-n2" in msg and "\n" not in msg


def test_other_policies_are_rejected():
    for bad in ("augmix-m5", "m9-n2", (1, 2, 3)):
        with pytest.raises(UserError, match="starting with 'rand-'"):
            ra.spec(bad)
