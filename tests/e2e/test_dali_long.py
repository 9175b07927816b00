"""DALI tests that take seconds in one process: RandAugment pipelines (the per-op probability; loaders resumed
bitwise), the epoch order of 64,000 records through the config path, and the validation sweep's other batch sizes.

Moved from tests/unit/data/test_loader.py, test_repeats.py and test_randaugment.py (issue 32; the test names, cases
and bodies kept): a pipeline with RandAugment takes 2 s (``rand-m9-n2``) to 8 s (DeiT's ``rand-m9-mstd0.5-inc1``,
random magnitudes) to build on a 2-core EPYC, in DALI's AutoGraph conversion of its graph (the first in a process
about 6 s more),
and each resume test builds two; the epoch order needs a data set of 64,000 records (2 s to make, 6 s to read);
the sweep builds a loader per rank for each of its 162 configurations.
The loaders' in-process contract, resume without augmentation included, stays in tests/unit/data/.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.bench_shuffle import epoch_order_stats
from data_tools.make_id_dataset import make_id_dataset
from tests.helpers.loaders import open_train
from tests.unit.data.test_loader import validation_sweep
from vitlarge.config.schema import Config
from vitlarge.data import TrainLoader
from vitlarge.data import randaugment as ra
from vitlarge.data.sources import train_loader

CPU = torch.device("cpu")


def train(demo_data, batch_size: int = 64, **kw) -> TrainLoader:
    return open_train(demo_data, batch_size, 32, **{"rank": 0, "world_size": 1, "device": CPU, "seed": 0, **kw})


@pytest.mark.parametrize("randaugment", ["rand-m9-n2", "rand-m9-mstd0.5-inc1"])  # None: in tests/unit
def test_restored_state_gives_bitwise_identical_batches(demo_data, randaugment):
    loader = train(demo_data, batch_size=64, randaugment=randaugment, seed=3)
    for _ in range(20):  # the restored stream crosses the epoch boundary at 1437 / 64 = 22.5 steps
        next(loader)
    state = loader.state()
    expected = [next(loader) for _ in range(5)]
    restored = train(demo_data, batch_size=64, randaugment=randaugment, seed=3, state=state)
    for (img_a, lab_a), (img_b, lab_b) in zip(expected, (next(restored) for _ in range(5))):
        assert torch.equal(img_a, img_b) and torch.equal(lab_a, lab_b)


def label_stream(loader, batches: int) -> np.ndarray:
    return np.concatenate([next(loader)[1].numpy() for _ in range(batches)])


@pytest.fixture(scope="module")
def ids_64k(tmp_path_factory) -> str:
    """64,000 identifiable 8x8 images in 64 train shards (label = record index)."""
    return make_id_dataset(str(tmp_path_factory.mktemp("ids_64k")), train=64000, train_shards=64).data_dir


def test_each_epoch_is_a_fresh_order_through_the_config_path(ids_64k):
    """Defaults (buffer, seeds, threads) through config -> train_loader; only the size is tiny."""
    cfg = Config()
    cfg.data.path, cfg.data.image_size = ids_64k, 8
    loader = train_loader(cfg, rank=0, world_size=1, device=CPU)
    batches = 2 * 64000 // cfg.train.micro_batch  # two epochs' worth: 500 batches of 256
    stats = epoch_order_stats([label_stream(loader, batches)], 64000)
    # Before (one slice per rank, a 4,096-record buffer): near 0.559, corr 0.956. A fresh permutation: ~0.10.
    assert stats["near"] <= 0.15 and abs(stats["corr"]) < 0.3, stats
    assert 1 <= stats["min_seen"] and stats["max_seen"] <= 3, stats


@pytest.mark.parametrize("stop_after", [5, 22])  # mid-epoch 1; the batch that straddles into epoch 2
def test_resume_mid_epoch_with_repeats_is_exact(demo_data, stop_after):
    """A DALI loader with repeats=3 stopped mid-epoch and rebuilt from its state yields bitwise the batches the
    uninterrupted loader yields (1437 records per rank and epoch at world 2 are 719: 22.5 batches of 32)."""
    kw = dict(rank=1, world_size=2, device=CPU, seed=4, repeats=3, randaugment="rand-m9-n2")
    loader = open_train(demo_data, 32, 32, **kw)
    for _ in range(stop_after):
        next(loader)
    state = loader.state()
    expected = [next(loader) for _ in range(6)]
    restored = open_train(demo_data, 32, 32, state=state, **kw)
    for (img_a, lab_a), (img_b, lab_b) in zip(expected, (next(restored) for _ in range(6))):
        assert torch.equal(lab_a, lab_b) and torch.equal(img_a, img_b)
    assert loader.num_examples_this_rank == 719


def test_every_validation_image_counts_once_per_pass_for_any_world_and_batch_size(id_datasets):
    """The validation sweep (tests/unit/data/test_loader.py) at the batch sizes it leaves here: 2, 3, 5, 6, 8, 9."""
    cases, old_bug_cases = validation_sweep(id_datasets, (2, 3, 5, 6, 8, 9))
    assert cases == 3 * 6 * 9 * 2 == 324 and old_bug_cases > 50


def unchanged_fraction(text: str, batches: int = 2, batch_size: int = 256) -> float:
    """Fraction of random noise images that DALI's RandAugment (``text``) leaves bitwise unchanged."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    @pipeline_def(enable_conditionals=True)
    def pipe():
        noise = fn.reshape(
            fn.cast(fn.random.uniform(range=[50, 200], shape=[16, 16, 3]), dtype=types.UINT8), layout="HWC"
        )
        return noise, ra.apply(noise, ra.spec(text), [16, 16])

    p = pipe(batch_size=batch_size, num_threads=1, device_id=None, seed=7)
    p.build()
    same = []
    for _ in range(batches):
        before, after = p.run()
        same += [np.array_equal(np.asarray(b), np.asarray(a)) for b, a in zip(before, after)]
    return float(np.mean(same))


def test_each_chosen_op_runs_with_timms_probability():
    # One layer: unchanged = skipped (1 - p) + ran an op that is a no-op on this noise (Solarize at
    # threshold 230 > 200: 1 op of 15). timm's p=0.5: about 0.53; p=1: about 0.07.
    assert 0.45 < unchanged_fraction("rand-m9-n1") < 0.62
    assert unchanged_fraction("rand-m9-n1-p1") < 0.15
    assert unchanged_fraction("rand-m9-n0") == 1.0


@pytest.mark.parametrize(
    "fields",
    [dict(hflip=False, crop_scale=(0.6, 1.0), crop_ratio=(0.8, 1.25)), dict(hflip=True), dict(hflip=True, repeats=3)],
    ids=["demo", "flip", "repeats"],
)
def test_a_graph_built_without_conditionals_is_the_same_graph(demo_data, fields):
    """AutoGraph (DALI's conditionals) takes seconds of a run's first step; a graph that needs none is built without
    it, and must be the same graph: serialized and checkpointed byte for byte, the same batches."""
    from vitlarge.data import pipelines
    from vitlarge.data.manifest import load_manifest, shard_files
    from vitlarge.data.repeats import RepeatedRecords
    from vitlarge.data.spec import TrainSpec

    spec = TrainSpec(demo_data, 16, 16, seed=5, initial_fill=64, num_threads=1, **fields)
    assert not pipelines.needs_conditionals(spec)
    files = shard_files(load_manifest(demo_data), "train")
    from nvidia.dali._utils import dali_trace

    kw = dict(shard_id=1, num_shards=2, decoder="cpu", batch_size=16, num_threads=1, device_id=None, seed=11)
    built = []
    # DALI records each operator's source line in the serialized graph for its error messages; AutoGraph's rewrite
    # of the code attributes some operators to a neighbouring line. The graphs are compared without that record.
    dali_trace.set_tracing(enabled=False)
    try:
        for make in (pipelines.train_pipeline, pipelines._train_conditional):
            records = RepeatedRecords(files, rank=1, world_size=2, repeats=3, seed=5) if spec.repeats > 1 else None
            pipe = make(spec, files, records=records, enable_checkpointing=True, **kw)
            pipe.build()
            batches = [np.asarray(pipe.run()[0].as_tensor()) for _ in range(3)]
            built.append((pipe._conditionals_enabled, pipe.serialize(), pipe.checkpoint(), batches))
    finally:
        dali_trace.set_tracing(enabled=True)
    (plain_on, plain, plain_state, plain_batches), (on, conditional, state, batches) = built
    assert (plain_on, on) == (False, True)
    assert plain == conditional and plain_state == state
    assert all(np.array_equal(a, b) for a, b in zip(plain_batches, batches))


@pytest.mark.parametrize(
    "fields",
    [dict(randaugment="rand-m9-n2"), dict(three_augment=True), dict(color_jitter=0.3), dict(crop="src")],
    ids=str,
)
def test_a_graph_that_branches_per_sample_or_crops_as_deit_is_built_with_conditionals(fields):
    from vitlarge.data import pipelines
    from vitlarge.data.spec import TrainSpec

    assert pipelines.needs_conditionals(TrainSpec("", 16, 16, seed=0, **fields))
