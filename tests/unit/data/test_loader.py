"""vitlarge.data loaders on the digits demo data: real DALI pipelines on the CPU."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from data_tools.make_id_dataset import make_id_dataset
from tests.helpers.data_fixtures import ID_SPLIT_SIZES
from tests.helpers.loaders import open_train, open_val
from vitlarge.data import TrainLoader, load_manifest
from vitlarge.errors import UserError

CPU = torch.device("cpu")


def train(demo_data, batch_size: int = 64, **kw) -> TrainLoader:
    return open_train(demo_data, batch_size, 32, **{"rank": 0, "world_size": 1, "device": CPU, "seed": 0, **kw})


def val_pass(demo_data, batch_size, rank, world_size, **kw):
    v = open_val(demo_data, batch_size, 32, rank=rank, world_size=world_size, device=CPU, **kw)
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


def validation_sweep(id_datasets, batch_sizes) -> tuple[int, int]:
    """World sizes 1..9 x ``batch_sizes`` x split sizes x 2 consecutive passes, ranks simulated by one ValLoader
    each; labels are record indexes, so a pass must count exactly range(n). Returns (cases, cases of the old
    sizing's error). Two passes: the second starts where the first left each reader, where the old sizing went
    wrong (on every other pass); the sweep ran three before (21 s of the unit tier under load)."""
    cases, old_bug_cases = 0, 0
    for n in ID_SPLIT_SIZES:
        for batch_size in batch_sizes:
            for world_size in range(1, 10):
                ranks = [
                    open_val(id_datasets[n], batch_size, 8, rank=r, world_size=world_size, device=CPU, num_threads=1)
                    for r in range(world_size)
                ]
                for _ in range(2):
                    seen = Counter(x for v in ranks for _, labels in v for x in labels.tolist())
                    assert seen == Counter(range(n)), (n, batch_size, world_size, cases)
                    cases += 1
                # The case the old sizing got wrong on every other pass: a short rank holding whole batches.
                old_bug_cases += 2 * (n % world_size != 0 and (n // world_size) % batch_size == 0)
    return cases, old_bug_cases


def test_every_validation_image_counts_once_per_pass_for_any_world_and_batch_size(id_datasets):
    """The sweep at batch sizes 1, 4 and 12: with the 9 world sizes and 3 split sizes they give every kind of rank
    the 9 batch sizes give (short or not; its records, and the padded count, a multiple of the batch or not; one
    run per pass or several; fewer records than a batch; how many padding-only runs). Batch sizes 2, 3, 5, 6, 8
    and 9: the same test in tests/e2e/test_dali_long.py."""
    cases, old_bug_cases = validation_sweep(id_datasets, (1, 4, 12))
    assert cases == 3 * 3 * 9 * 2 == 162 and old_bug_cases > 50


def test_a_pass_abandoned_before_its_padding_only_batch_is_drained(id_datasets):
    # 37 over 2 ranks: rank 0 holds 18 = 3 batches of 6; DALI pads it to 19, i.e. a 4th, padding-only run.
    v = open_val(id_datasets[37], 6, 8, rank=0, world_size=2, device=CPU)
    assert len(v) == 3
    first = torch.cat([lab for _, lab in v])
    assert torch.equal(first, torch.arange(18))
    it = iter(v)
    for _ in range(3):  # every real batch taken; the generator never runs the padding-only one
        next(it)
    del it
    assert torch.equal(torch.cat([lab for _, lab in v]), first)


def test_validation_is_reiterable_and_survives_an_abandoned_pass(demo_data):
    v = open_val(demo_data, 32, 32, rank=1, world_size=3, device=CPU)
    first = torch.cat([lab for _, lab in v])
    for i, _ in enumerate(v):  # abandon the second pass early
        if i == 2:
            break
    third = torch.cat([lab for _, lab in v])
    assert len(first) == v.num_examples_this_rank == 120 and torch.equal(first, third)


@pytest.mark.parametrize("randaugment", [None])
def test_restored_state_gives_bitwise_identical_batches(demo_data, randaugment):
    """With RandAugment ("rand-m9-n2", DeiT's "rand-m9-mstd0.5-inc1": 2 to 8 s per loader build on a 2-core
    EPYC, in DALI's AutoGraph): the same test in tests/e2e/test_dali_long.py."""
    loader = train(demo_data, batch_size=64, randaugment=randaugment, seed=3)
    for _ in range(20):  # the restored stream crosses the epoch boundary at 1437 / 64 = 22.5 steps
        next(loader)
    state = loader.state()
    expected = [next(loader) for _ in range(5)]
    restored = train(demo_data, batch_size=64, randaugment=randaugment, seed=3, state=state)
    for (img_a, lab_a), (img_b, lab_b) in zip(expected, (next(restored) for _ in range(5))):
        assert torch.equal(img_a, img_b) and torch.equal(lab_a, lab_b)


def test_full_decode_then_crop_is_a_resumable_stream_of_its_own(demo_data):
    """``rrc_decode="full"`` (the whole JPEG, then DALI's random_resized_crop): batches of the same form as the
    crop-window decode's, another random stream (so a state of one does not resume the other), resumed bitwise.
    ``hw_decoder_load`` does nothing on the CPU (the same batches) yet is part of the stream's settings."""
    full = train(demo_data, batch_size=16, rrc_decode="full", seed=3)
    roi = train(demo_data, batch_size=16, seed=3)
    for _ in range(3):
        (img_f, lab_f), (img_r, lab_r) = next(full), next(roi)
        assert img_f.shape == img_r.shape == (16, 3, 32, 32) and torch.equal(lab_f, lab_r)
        assert not torch.equal(img_f, img_r)
        assert abs(float(img_f.mean()) - float(img_r.mean())) < 0.5
    state = full.state()
    expected = [next(full) for _ in range(3)]
    restored = train(demo_data, batch_size=16, rrc_decode="full", seed=3, state=state)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(expected, (next(restored) for _ in range(3))))
    with pytest.raises(UserError, match="different data or loader settings"):
        train(demo_data, batch_size=16, seed=3, state=state)
    hw0 = train(demo_data, batch_size=16, hw_decoder_load=0.0, seed=3)
    again = train(demo_data, batch_size=16, seed=3)
    assert torch.equal(next(hw0)[0], next(again)[0])
    with pytest.raises(UserError, match="different data or loader settings"):
        train(demo_data, batch_size=16, seed=3, state=hw0.state())


def test_state_from_other_settings_is_rejected(demo_data):
    state = train(demo_data, batch_size=16).state()
    with pytest.raises(UserError, match="different data or loader settings"):
        train(demo_data, batch_size=32, state=state)
    with pytest.raises(UserError, match="not one TrainLoader.state"):
        train(demo_data, batch_size=16, state="garbage")


def test_randaugment_spec_is_validated(demo_data):
    with pytest.raises(UserError, match="part 'x9'"):
        train(demo_data, randaugment="rand-x9")


# --- epochs: a fresh order every epoch, exact partition, exact resume ----------------------------


def label_stream(loader, batches: int) -> np.ndarray:
    return np.concatenate([next(loader)[1].numpy() for _ in range(batches)])


@pytest.fixture(scope="module")
def ids_600(tmp_path_factory) -> str:
    return make_id_dataset(str(tmp_path_factory.mktemp("ids_600")), train=600, train_shards=12).data_dir


def test_ranks_partition_every_epoch_and_their_slices_move(ids_600):
    world, batch = 3, 50  # 200 records per rank: 4 batches per epoch
    ranks = [
        open_train(ids_600, batch, 8, rank=r, world_size=world, device=CPU, seed=5, initial_fill=64)
        for r in range(world)
    ]
    per_epoch = [[set(label_stream(loader, 4).tolist()) for _ in range(3)] for loader in ranks]
    for epoch in range(3):
        assert sorted(x for r in range(world) for x in per_epoch[r][epoch]) == list(range(600))
    assert per_epoch[0][0] != per_epoch[0][1] != per_epoch[0][2]  # the shard order moved between ranks


@pytest.mark.parametrize("stop_after", [3, 4, 6])  # mid-epoch 1, exactly at its end, mid-epoch 2
def test_resume_mid_epoch_and_at_the_epoch_boundary_is_exact(ids_600, stop_after):
    kw = dict(rank=1, world_size=3, device=CPU, seed=5, initial_fill=64)
    loader = open_train(ids_600, 50, 8, **kw)
    label_stream(loader, stop_after)
    state = loader.state()
    expected = [next(loader) for _ in range(6)]  # crosses into the next epoch (4 batches per epoch)
    restored = open_train(ids_600, 50, 8, state=state, **kw)
    for (img_a, lab_a), (img_b, lab_b) in zip(expected, (next(restored) for _ in range(6))):
        assert torch.equal(lab_a, lab_b) and torch.equal(img_a, img_b)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.pop("fingerprint"),
        lambda d: d.pop("dali"),
        lambda d: d.pop("version"),
        lambda d: d.update(version=1),
        lambda d: d.update(fingerprint=7),
        lambda d: d.update(dali="not base64!"),
    ],
)
def test_state_with_missing_or_malformed_fields_is_one_user_error(demo_data, edit):
    doc = json.loads(train(demo_data, batch_size=16).state())
    edit(doc)
    with pytest.raises(UserError, match="not one TrainLoader.state") as e:
        train(demo_data, batch_size=16, state=json.dumps(doc))
    assert "\n" not in str(e.value)
    for junk in ("[]", "null", "3"):
        with pytest.raises(UserError, match="not one TrainLoader.state"):
            train(demo_data, batch_size=16, state=junk)


@pytest.mark.parametrize("blob", [b"\x00junk protobuf\xff" * 8, b"", b"\x0a\xff\xff\xff\xff\x0f"])
def test_a_state_with_junk_dali_bytes_is_one_user_error(demo_data, blob):
    """A loader state whose fingerprint matches but whose DALI checkpoint is not one (a damaged or crafted
    rank file): one line naming the state, not DALI's protobuf traceback."""
    import base64

    doc = json.loads(train(demo_data, batch_size=16).state())
    doc["dali"] = base64.b64encode(blob).decode()
    with pytest.raises(UserError, match="TrainLoader state holds no DALI checkpoint") as e:
        train(demo_data, batch_size=16, state=json.dumps(doc))
    assert "\n" not in str(e.value)
