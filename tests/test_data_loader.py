"""vitlarge.data loaders on the digits demo data: real DALI pipelines on the CPU."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from vitlarge.data import TrainLoader, ValLoader, load_manifest
from vitlarge.errors import UserError

CPU = torch.device("cpu")


def train(demo_data, batch_size: int = 64, **kw) -> TrainLoader:
    return TrainLoader(demo_data, batch_size, 32, **{"rank": 0, "world_size": 1, "device": CPU, "seed": 0, **kw})


def val_pass(demo_data, batch_size, rank, world_size, **kw):
    v = ValLoader(demo_data, batch_size, 32, rank=rank, world_size=world_size, device=CPU, **kw)
    images, labels = zip(*v)
    return v, torch.cat(images), torch.cat(labels)


def test_manifest_api(demo_data):
    m = load_manifest(demo_data)
    assert (m.num_classes, m.label_offset) == (10, 1)
    assert (m.num_examples("train"), m.num_examples("validation")) == (1437, 360)


def test_train_batches_are_an_infinite_normalized_stream(demo_data):
    loader = train(demo_data)
    assert loader.num_examples_this_rank == 1437
    steps = 1437 // 64 + 3  # past the end of the first epoch: no StopIteration, ever
    seen = Counter()
    for _ in range(steps):
        images, labels = next(loader)
        assert images.shape == (64, 3, 32, 32) and images.dtype == torch.float32 and images.device == CPU
        assert labels.shape == (64,) and labels.dtype == torch.int64
        assert 0 <= int(labels.min()) and int(labels.max()) <= 9
        seen.update(labels.tolist())
    assert len(seen) == 10
    assert -2.2 < float(images.mean()) < 2.7 and float(images.std()) > 0.1  # normalized, not 0..255


def test_two_ranks_read_disjoint_shards_that_cover_the_split(demo_data):
    """With the crop forced to the whole image and no flip, each output identifies its record."""
    ident = dict(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), hflip=False, batch_size=1)
    seen = []
    for rank in range(2):
        loader = train(demo_data, rank=rank, world_size=2, **ident)
        n = loader.num_examples_this_rank
        assert n in (718, 719)
        seen.append(Counter())
        for _ in range(n):
            images, labels = next(loader)
            seen[rank][(images.numpy().tobytes(), int(labels[0]))] += 1
    # Reference: the same identity transform over the whole split, one rank.
    ref = Counter()
    loader = train(demo_data, **ident)
    for _ in range(1437):
        images, labels = next(loader)
        ref[(images.numpy().tobytes(), int(labels[0]))] += 1
    assert not (set(seen[0]) & set(seen[1]))
    assert seen[0] + seen[1] == ref
    assert sum(ref.values()) == 1437


@pytest.mark.parametrize("batch_size", [7, 50])
def test_validation_counts_are_exact_for_any_world_size(demo_data, batch_size):
    _, ref_images, ref_labels = val_pass(demo_data, batch_size, 0, 1)
    assert len(ref_labels) == 360
    for world_size in (2, 3):
        parts = [val_pass(demo_data, batch_size, r, world_size) for r in range(world_size)]
        assert sum(v.num_examples_this_rank for v, _, _ in parts) == 360
        assert torch.equal(torch.cat([lab for _, _, lab in parts]), ref_labels)
        assert torch.equal(torch.cat([img for _, img, _ in parts]), ref_images)


def test_validation_is_reiterable_and_survives_an_abandoned_pass(demo_data):
    v = ValLoader(demo_data, 32, 32, rank=1, world_size=3, device=CPU)
    first = torch.cat([lab for _, lab in v])
    for i, _ in enumerate(v):  # abandon the second pass early
        if i == 2:
            break
    third = torch.cat([lab for _, lab in v])
    assert len(first) == v.num_examples_this_rank == 120 and torch.equal(first, third)


@pytest.mark.parametrize("randaugment", [None, "rand-m9-n2"])
def test_restored_state_gives_bitwise_identical_batches(demo_data, randaugment):
    loader = train(demo_data, batch_size=64, randaugment=randaugment, seed=3)
    for _ in range(20):  # the restored stream crosses the epoch boundary at 1437 / 64 = 22.5 steps
        next(loader)
    state = loader.state()
    expected = [next(loader) for _ in range(5)]
    restored = train(demo_data, batch_size=64, randaugment=randaugment, seed=3, state=state)
    for (img_a, lab_a), (img_b, lab_b) in zip(expected, (next(restored) for _ in range(5))):
        assert torch.equal(img_a, img_b) and torch.equal(lab_a, lab_b)


def test_state_from_other_settings_is_rejected(demo_data):
    state = train(demo_data, batch_size=16).state()
    with pytest.raises(UserError, match="different data or loader settings"):
        train(demo_data, batch_size=32, state=state)
    with pytest.raises(UserError, match="not one TrainLoader.state"):
        train(demo_data, batch_size=16, state="garbage")


def test_randaugment_spec_is_validated(demo_data):
    with pytest.raises(UserError, match="rand-m9-n2"):
        train(demo_data, randaugment="rand-x9")
