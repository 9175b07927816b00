"""Repeated augmentation (``data.repeats``, vitlarge/data/repeats.py): every index counted at world sizes 1-9,
the order against timm's ``RepeatAugSampler``, and the real DALI loader reading it and resuming mid-epoch."""

from __future__ import annotations

import math
import os
from collections import Counter

import numpy as np
import pytest
import torch
from timm.data.distributed_sampler import RepeatAugSampler

from data_tools.make_id_dataset import make_id_dataset
from tests.helpers.loaders import open_train
from vitlarge.config.schema import Config
from vitlarge.data.common import SettingsChanged
from vitlarge.data.repeats import epoch_order
from vitlarge.data.sources import train_loader

CPU = torch.device("cpu")
N = 2521  # 2520 + 1: divisible by none of the world sizes 2..9


def timm_order(n: int, rank: int, world: int, repeats: int, epoch_key: int) -> list[int]:
    sampler = RepeatAugSampler(range(n), num_replicas=world, rank=rank, num_repeats=repeats, selected_round=0)
    sampler.set_epoch(epoch_key)
    return list(sampler)


@pytest.mark.parametrize("repeats", [2, 3])
@pytest.mark.parametrize("world", range(1, 10))
def test_every_index_is_counted_at_any_world_size(world, repeats):
    """Per epoch each rank reads ceil(n / world) records; over the ranks the records are the first
    ``ceil(world * ceil(n / world) / repeats)`` of a permutation, each ``repeats`` times (only the last one
    may be cut short, where the epoch's length is not a multiple of ``repeats``, as in timm); the copies of an
    image sit on different ranks when ``world >= repeats``; the next epoch is another selection in another order."""
    per_rank = math.ceil(N / world)
    epochs = []
    for epoch in range(2):
        orders = [epoch_order(N, rank, world, repeats, 7, epoch) for rank in range(world)]
        assert all(len(o) == per_rank for o in orders)
        counts = Counter(i for o in orders for i in o)
        assert sum(counts.values()) == world * per_rank
        assert len(counts) == math.ceil(world * per_rank / repeats)
        short = [i for i, c in counts.items() if c != repeats]
        assert len(short) == (1 if world * per_rank % repeats else 0)
        assert all(counts[i] == world * per_rank % repeats for i in short)
        if world >= repeats:
            ranks_of = {}
            for rank, o in enumerate(orders):
                for i in o:
                    ranks_of.setdefault(i, []).append(rank)
            assert all(len(set(r)) == len(r) for r in ranks_of.values())
        epochs.append((orders, set(counts)))
    (first, chosen_first), (second, chosen_second) = epochs
    assert chosen_first != chosen_second and all(a != b for a, b in zip(first, second))


@pytest.mark.parametrize("world", [1, 4, 7])
def test_the_order_is_timms_repeat_aug_sampler(world):
    """With seed 0, epoch e is timm's ``RepeatAugSampler(selected_round=0).set_epoch(e)`` exactly; another seed
    is timm's at ``(seed * 0x9E3779B1 + e) mod 2**32`` (timm seeds with the epoch alone; torch keeps 32 bits)."""
    for rank in range(world):
        for epoch in range(3):
            assert epoch_order(N, rank, world, 3, 0, epoch) == timm_order(N, rank, world, 3, epoch)
            assert epoch_order(N, rank, world, 3, 5, epoch) == timm_order(
                N, rank, world, 3, (5 * 0x9E3779B1 + epoch) % 2**32
            )
    seeds = [epoch_order(N, 0, world, 3, seed, 0) for seed in (5, 6, 1005, 2**31 - 1)]
    assert all(a != b for i, a in enumerate(seeds) for b in seeds[:i])


@pytest.fixture(scope="module")
def ids_601(tmp_path_factory) -> str:
    """601 identifiable records (label = record index) in 7 shards."""
    return make_id_dataset(str(tmp_path_factory.mktemp("ids_601")), train=601, train_shards=7).data_dir


def labels(loader, batches: int) -> list[int]:
    return torch.cat([next(loader)[1] for _ in range(batches)]).tolist()


@pytest.mark.parametrize("world", [2, 4])
def test_the_dali_loader_reads_each_ranks_stream_across_epochs(ids_601, world):
    """The loader's labels (= record indices) are each rank's epochs one after another (batches straddle the
    boundary, as the reader's do), through the config path; and every record is read where it should be."""
    cfg = Config()
    cfg.data.path, cfg.data.image_size, cfg.data.repeats, cfg.train.micro_batch, cfg.train.seed = ids_601, 8, 3, 32, 9
    per_rank = math.ceil(601 / world)
    batches = 2 * per_rank // 32 + 1
    for rank in range(world):
        loader = train_loader(cfg, rank, world, CPU)
        assert loader.num_examples_this_rank == per_rank
        stream = [i for e in range(3) for i in epoch_order(601, rank, world, 3, 9, e)]
        assert labels(loader, batches) == stream[: batches * 32]


def test_the_copies_on_three_ranks_are_augmented_independently(demo_data):
    """world 3, repeats 3: the ranks read the same images in the same order (copy c of image j is rank c's j-th
    record), each through its own augmentation."""
    kw = dict(world_size=3, device=CPU, seed=2, repeats=3)
    ranks = [open_train(demo_data, 16, 32, rank=r, **kw) for r in range(3)]
    for _ in range(3):
        (x0, y0), (x1, y1), (x2, y2) = (next(loader) for loader in ranks)
        assert torch.equal(y0, y1) and torch.equal(y1, y2)
        assert all(not torch.equal(a[i], b[i]) for a, b in ((x0, x1), (x1, x2), (x0, x2)) for i in range(16))


def test_a_state_of_another_repeats_is_refused_and_repeats_1_keeps_the_old_fingerprint(demo_data):
    kw = dict(rank=0, world_size=1, device=CPU, seed=0)
    plain = open_train(demo_data, 16, 32, **kw)
    assert open_train(demo_data, 16, 32, repeats=1, **kw)._fingerprint == plain._fingerprint
    state = open_train(demo_data, 16, 32, repeats=3, **kw).state()
    with pytest.raises(SettingsChanged):
        open_train(demo_data, 16, 32, state=state, **kw)


class SampleInfo:
    """What DALI passes a sample-mode source: the sample's position in the (never ending) epoch."""

    def __init__(self, idx_in_epoch: int):
        self.idx_in_epoch = idx_in_epoch


def test_a_loader_with_read_workers_is_built_in_the_main_thread(demo_data):
    """Its workers die with the thread that started them (PR_SET_PDEATHSIG): a loader built in a helper thread
    would lose them when the thread ends, and then wait forever."""
    import threading

    import torch

    from tests.helpers.loaders import open_train

    errors = []

    def build():
        try:
            open_train(demo_data, 16, 16, rank=0, world_size=1, device=torch.device("cpu"), seed=0, repeats=3,
                        read_workers=1, num_threads=1)  # fmt: skip
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=build)
    t.start()
    t.join(60)
    assert errors == ["a TrainLoader with read_workers > 0 must be built in the main thread"]


def test_the_reader_pickles_without_its_open_files(ids_601):
    """DALI's spawned workers get a pickled copy: it reads the same records, and the copy's files are its own."""
    import pickle

    from vitlarge.data import repeats
    from vitlarge.data.manifest import load_manifest

    shards = [
        (os.path.join(ids_601, s.file), os.path.join(ids_601, s.index)) for s in load_manifest(ids_601).shards("train")
    ]
    reader = repeats.RepeatedRecords(shards, rank=2, world_size=5, repeats=3, seed=1)
    first = [reader(SampleInfo(p)) for p in range(200, 260)]
    assert reader._files
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._files == {} and copy._orders == {}
    again = [copy(SampleInfo(p)) for p in range(200, 260)]
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(first, again))
    assert [int(x[1][0]) for x in first] == [reader.record_at(p) for p in range(200, 260)]
    reader.close(), copy.close()


@pytest.fixture(scope="module")
def ids_300_shards(tmp_path_factory) -> str:
    """900 identifiable records (label = record index) in 300 shards: more than a soft limit of 256 allows."""
    return make_id_dataset(str(tmp_path_factory.mktemp("ids_300_shards")), train=900, train_shards=300).data_dir


def test_a_reader_keeps_every_shard_open_where_the_file_limit_allows_and_reads_them_all_right(ids_300_shards):
    """ImageNet has 1024 training shards, and the stream touches another shard for nearly every record: the reader
    raises the soft open-file limit to keep them all open (a limit of 256 and 300 shards: raised to 300 + 1024 + 2),
    and every record reads right. In this process, its soft limit lowered to 256 and put back after (the hard limit
    stays: only root could raise it again). Where the hard limit forbids the raise, a fresh process of its own:
    tests/e2e/test_fresh_process.py::test_a_reader_keeps_fewest_open_where_the_hard_file_limit_forbids_more."""
    import resource

    from nvidia.dali.types import SampleInfo as DaliSampleInfo

    from vitlarge.data import repeats
    from vitlarge.data.manifest import load_manifest

    n_shards, before = 300, resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n_shards + repeats.reserved_files(1)
    if before[1] != resource.RLIM_INFINITY and before[1] < need:
        pytest.skip(f"the hard open-file limit is below {need}")
    shards = [
        (os.path.join(ids_300_shards, s.file), os.path.join(ids_300_shards, s.index))
        for s in load_manifest(ids_300_shards).shards("train")
    ]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, before[1]))
    try:
        reader = repeats.RepeatedRecords(shards, rank=0, world_size=1, repeats=3, seed=0)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        read, most_open = [], 0
        for position in range(reader.per_rank):
            read.append(int(reader(DaliSampleInfo(position, position, 0, 0))[1][0]))
            most_open = max(most_open, len(reader._files))
        reader.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
    assert read == epoch_order(3 * n_shards, 0, 1, 3, 0, 0)  # the labels are the record indices
    touched = len({record // 3 for record in read})  # an epoch shows about a third of the images
    assert soft == need
    assert reader.max_open == n_shards and most_open == touched  # each opened once, none closed


def test_the_open_budget_leaves_the_rest_of_the_process_its_files():
    """Two descriptors per rank besides OTHER_FILES: rank 0 of 256 gloo ranks holds a connection to each peer and
    the rendezvous store's."""
    from vitlarge.data.repeats import FEWEST_OPEN, OTHER_FILES, open_budget, reserved_files

    assert reserved_files(256) == OTHER_FILES + 512
    assert open_budget(1024, 1024, 8) == FEWEST_OPEN  # the usual soft limit, not raised: what the first version kept
    assert open_budget(1024, 1024 + reserved_files(8), 8) == 1024
    assert open_budget(1024, 1024 + reserved_files(8), 256) == 1024 - 496
    assert open_budget(1024, 1 << 20, 128) == 1024 and open_budget(4, 1, 1) == 4
