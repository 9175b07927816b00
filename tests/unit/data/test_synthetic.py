"""data.source=synthetic (vitlarge/data/synthetic.py): the loader contract against real DALI loaders,
reproducible and resumable streams, an exact validation set.

In-process: the synthetic loaders next to DALI's on the demo digits (same shapes, dtypes, layout
and validation padding), the stream's state, the validation set at several world and batch sizes.
Real train.py runs without data are in tests/e2e/test_synthetic_runs.py (and its --dry-run in
tests/e2e/test_train_cli.py).
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import ROOT
from vitlarge.config.load import load_config
from vitlarge.constants import IMAGENET_MEAN, IMAGENET_STD
from vitlarge.data import synthetic
from vitlarge.data.common import val_forwards
from vitlarge.data.sources import checked_manifest, train_loader, val_loader
from vitlarge.errors import UserError

RECIPE = "recipes/demo_digits.py"
CPU = torch.device("cpu")
NO_DATA = "data.path=/nonexistent/no-data-here"  # proves that no run below reads a data directory
# Normalised pixel range per channel: (0 - mean) / std .. (1 - mean) / std.
LOW = torch.tensor([-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD)]).view(1, 3, 1, 1)
HIGH = torch.tensor([(1 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD)]).view(1, 3, 1, 1)


def demo(*overrides: str):
    return load_config(ROOT / RECIPE, ["data.source=synthetic", NO_DATA, *overrides])


def test_batches_match_the_dali_loaders_contract(demo_data):
    """Same config, both sources: equal shapes, dtypes, device, memory layout, label range, and the same
    validation batches and padding on every rank (360 synthetic validation images, as the digits have)."""
    real = load_config(ROOT / RECIPE, [f"data.path={demo_data}"])
    synth = demo("data.synthetic_val_examples=360")
    for rank in range(2):
        xd, yd = next(train_loader(real, rank, 2, CPU))
        xs, ys = next(train_loader(synth, rank, 2, CPU))
        for a, b in ((xd, xs), (yd, ys)):
            assert (a.shape, a.dtype, a.device, a.stride(), a.is_contiguous()) == (
                b.shape,
                b.dtype,
                b.device,
                b.stride(),
                b.is_contiguous(),
            )
        assert xs.shape == (16, 3, 16, 16) and xs.dtype == torch.float32 and ys.dtype == torch.int64
        assert 0 <= int(ys.min()) and int(ys.max()) < 10
        for x in (xd, xs):  # both normalised the same way: inside the normalised pixel range
            assert bool(((x >= LOW - 1e-5) & (x <= HIGH + 1e-5)).all())
        assert float(xs.min()) < -1.5 and float(xs.max()) > 2.0  # noise spans it
        dali = [(x.shape, x.dtype, y.shape, y.dtype, keep) for x, y, keep in val_loader(real, rank, 2, CPU).masked()]
        made = [(x.shape, x.dtype, y.shape, y.dtype, keep) for x, y, keep in val_loader(synth, rank, 2, CPU).masked()]
        assert made == dali and len(made) == val_forwards(360, 2, 16) and made[-1][-1] == 180 - 11 * 16


def test_train_stream_is_reproducible_rank_distinct_and_resumes_exactly():
    cfg = demo()
    a = train_loader(cfg, 0, 2, CPU)
    first = next(a)
    state = a.state()
    rest = [next(a) for _ in range(2)]
    again = train_loader(cfg, 0, 2, CPU)
    assert all(torch.equal(x, y) for x, y in zip(next(again), first))
    resumed = train_loader(cfg, 0, 2, CPU, state=state)
    for (x, y), (rx, ry) in zip(rest, (next(resumed) for _ in range(2))):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    assert not torch.equal(next(train_loader(cfg, 1, 2, CPU))[0], first[0])  # another rank, another stream
    assert not torch.equal(rest[0][0], first[0])  # another batch, other images
    assert json.loads(resumed.state())["batches"] == 3
    with pytest.raises(UserError, match="different settings"):
        train_loader(demo("train.micro_batch=8"), 0, 2, CPU, state=state)
    with pytest.raises(UserError, match="not one SyntheticTrain.state"):
        train_loader(cfg, 0, 2, CPU, state=json.dumps({"source": "synthetic", "batches": -1, "fingerprint": "x"}))


def test_next_batch_is_made_on_the_device_without_copies():
    """The ops of one ``next()``: allocations and in-place fills, no copy or transfer (a batch made on the
    host and moved would show ``aten::to``/``aten::copy_``, a tensor from host values ``aten::lift_fresh``)."""
    loader = train_loader(demo(), 0, 1, CPU)
    next(loader)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], acc_events=True) as prof:
        next(loader)
    ops = {e.name for e in prof.events() if e.name.startswith("aten::")}
    assert {"aten::uniform_", "aten::random_"} <= ops
    assert not ops & {"aten::to", "aten::_to_copy", "aten::copy_", "aten::lift_fresh", "aten::cat"}, ops


def test_validation_set_is_the_same_at_any_world_size_and_batch_size():
    """Every example once per pass, the same images and labels, whatever the world and batch size; every
    rank runs the same number of forwards (`val_forwards`), as a sharded model needs."""
    passes = []
    for world, batch in ((1, 64), (2, 16), (3, 7), (4, 100)):
        cfg = demo(
            f"train.micro_batch={batch}",
            f"train.global_batch={batch * world}",
            "augment.mixup_alpha=0",
            "data.synthetic_val_examples=50",
        )
        images, labels = [], []
        for rank in range(world):
            v = val_loader(cfg, rank, world, CPU)
            assert len(list(v.masked())) == val_forwards(50, world, batch)
            for x, y in v:
                images.append(x)
                labels.append(y)
        passes.append((torch.cat(images), torch.cat(labels)))
    for x, y in passes:
        assert x.shape == (50, 3, 16, 16) and y.shape == (50,)
        assert torch.equal(x, passes[0][0]) and torch.equal(y, passes[0][1])
    assert len({tuple(img.flatten()[:8].tolist()) for img in passes[0][0]}) == 50  # 50 different images


def test_check_data_reads_no_file_and_names_the_classes():
    m = checked_manifest(demo())
    assert [c.synset for c in m.classes] == synthetic.class_names(10) == [f"class_{i:04d}" for i in range(10)]
    assert (m.num_classes, m.num_examples("train"), m.num_examples("validation")) == (10, 1437, 512)
    with pytest.raises(UserError, match="/nonexistent/no-data-here"):  # the same config reads it with tfrecord
        checked_manifest(demo("data.source=tfrecord"))


def test_a_checkpoint_continues_only_the_source_that_wrote_it(demo_data):
    synth = train_loader(demo(), 0, 1, CPU)
    next(synth)
    real = load_config(ROOT / RECIPE, [f"data.path={demo_data}"])
    with pytest.raises(UserError, match="trained with data.source=synthetic.*resume with data.source=synthetic"):
        train_loader(real, 0, 1, CPU, state=synth.state())
    dali = train_loader(real, 0, 1, CPU)
    next(dali)
    with pytest.raises(UserError, match="trained with data.source=tfrecord"):
        train_loader(demo(), 0, 1, CPU, state=dali.state())


# --- train.py runs -----------------------------------------------------------------------------------
