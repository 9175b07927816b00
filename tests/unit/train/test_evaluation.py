"""Evaluation forwards (vitlarge.data.loader.val_forwards): every rank runs the same number.

Under fsdp every forward is collective, so every rank must run the same number of evaluation
forwards. A loader that skipped DALI's padding-only runs made a rank whose slice is a whole number
of batches run one forward fewer than a rank holding one more record, and the collective hung.
The multi-process evaluations are in tests/e2e/test_evaluate.py.
"""

import math

import pytest

IMAGENET_VAL = 50_000


@pytest.mark.parametrize("world_size", [*range(1, 10), 71, 130, 156])
def test_every_rank_runs_the_same_number_of_forwards_on_imagenet_val(world_size):
    from vitlarge.data.loader import val_forwards
    from vitlarge.data.pipelines import shard_range

    mb = 64
    forwards = val_forwards(IMAGENET_VAL, world_size, mb)  # what ValLoader.masked gives every rank
    real = [shard_range(IMAGENET_VAL, r, world_size) for r in range(world_size)]
    real = [end - begin for begin, end in real]
    assert sum(real) == IMAGENET_VAL
    assert all(math.ceil(n / mb) <= forwards for n in real)  # every real record fits the forwards
    skipped = {math.ceil(n / mb) for n in real}  # the old count: padding-only runs skipped
    if world_size in (71, 130, 156):  # slices of two sizes: 11/12, 6/7, 5/6 forwards
        assert len(skipped) == 2 and max(skipped) == forwards
