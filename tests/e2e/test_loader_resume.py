"""A loader whose build takes seconds, resumed bitwise: DeiT's RandAugment string (``rand-m9-mstd0.5-inc1``).

Moved from tests/unit/data/test_loader.py (issue 32; the test name, case and body kept): each such loader takes
about 8 s to build on a 2-core EPYC (DALI's AutoGraph conversion of the RandAugment graph with random
magnitudes), and the test builds two. The same test runs there for no augmentation and ``rand-m9-n2``.
"""

from __future__ import annotations

import pytest
import torch

from vitlarge.data import TrainLoader

CPU = torch.device("cpu")


def train(demo_data, batch_size: int = 64, **kw) -> TrainLoader:
    return TrainLoader(demo_data, batch_size, 32, **{"rank": 0, "world_size": 1, "device": CPU, "seed": 0, **kw})


@pytest.mark.parametrize("randaugment", ["rand-m9-mstd0.5-inc1"])
def test_restored_state_gives_bitwise_identical_batches(demo_data, randaugment):
    loader = train(demo_data, batch_size=64, randaugment=randaugment, seed=3)
    for _ in range(20):  # the restored stream crosses the epoch boundary at 1437 / 64 = 22.5 steps
        next(loader)
    state = loader.state()
    expected = [next(loader) for _ in range(5)]
    restored = train(demo_data, batch_size=64, randaugment=randaugment, seed=3, state=state)
    for (img_a, lab_a), (img_b, lab_b) in zip(expected, (next(restored) for _ in range(5))):
        assert torch.equal(img_a, img_b) and torch.equal(lab_a, lab_b)
