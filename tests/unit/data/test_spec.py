"""Loader specs (vitlarge.data.spec) and the typed data state (vitlarge.data.phased.DataState).

No DALI and no files: a spec is made from a config and a phase once; its fingerprint is the hash of the
dict every release before the specs wrote (so their checkpoints' loader states still resume), and the data
state writes the bytes those checkpoints hold.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.helpers.recipes import DEMO_TRAIN_EXAMPLES, demo
from vitlarge.config.load import validate
from vitlarge.constants import IMAGENET_MEAN, IMAGENET_STD
from vitlarge.data import TrainSpec, ValSpec
from vitlarge.data.common import STATE_VERSION
from vitlarge.data.phased import NO_PHASES, DataState
from vitlarge.data.sources import train_spec, val_spec
from vitlarge.errors import UserError
from vitlarge.plan.plan import make_plan, stream_seed

SHARDS = [("train-00000-of-00002", 1234), ("train-00001-of-00002", 999)]


def hashed(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def released_tfrecord_dict(**changed) -> dict:
    """The dict TrainLoader hashed before the specs (fe31341), for batch 8, 32 px, rank 1 of 2, seed 7."""
    settings = dict(
        shards=SHARDS,
        batch_size=8,
        image_size=32,
        rank=1,
        world_size=2,
        seed=7,
        crop_scale=[0.08, 1.0],
        crop_ratio=[3 / 4, 4 / 3],
        hflip=True,
        randaugment=None,
        mean=[255.0 * x for x in IMAGENET_MEAN],
        std=[255.0 * x for x in IMAGENET_STD],
        initial_fill=4096,
        interpolation="bilinear",
    )
    settings.update(changed)
    return settings


@pytest.mark.parametrize(
    "fields, changed",
    [
        ({}, {}),
        ({"crop": "src"}, {"crop": "src"}),
        ({"crop": "src", "src_padding": 2}, {"crop": "src", "src_padding": 2}),
        ({"crop": "rrc", "src_padding": 2}, {}),  # unused without the simple random crop
        ({"three_augment": True, "color_jitter": 0.3}, {"three_augment": True, "color_jitter": 0.3}),
        ({"repeats": 3}, {"repeats": 3, "repeats_source": "sample"}),
        ({"read_workers": 2, "num_threads": 5, "prefetch_queue_depth": 3, "label_offset": 1}, {}),  # not the stream
        (
            {"randaugment": "rand-m9-mstd0.5-inc1", "interpolation": "bicubic", "crop_scale": (0.35, 1.0)},
            {
                "randaugment": "rand-m9-n2-p0.5-mstd0.5-mmax10-inc1",
                "interpolation": "bicubic",
                "crop_scale": [0.35, 1.0],
            },
        ),
    ],
)
def test_the_train_fingerprint_hashes_the_released_dict(fields, changed):
    spec = TrainSpec("/data", 8, 32, seed=7, **fields)
    assert spec.fingerprint(1, 2, SHARDS) == hashed(released_tfrecord_dict(**changed))


def test_the_synthetic_fingerprint_hashes_the_released_dict():
    spec = TrainSpec("", 8, 32, source="synthetic", num_classes=10, num_examples=100, mean=(0.5,) * 3, seed=7)
    released = dict(batch_size=8, image_size=32, num_classes=10, rank=1, world_size=2, seed=7)
    released.update(mean=[0.5] * 3, std=list(IMAGENET_STD))
    assert spec.fingerprint(1, 2) == hashed(released)
    # The synthetic stream reads no augmentation: another crop changes neither its hash nor its checks.
    assert TrainSpec("", 8, 32, source="synthetic", num_classes=10, num_examples=100, mean=(0.5,) * 3, seed=7,
                     crop="center", color_jitter=-1).fingerprint(1, 2) == spec.fingerprint(1, 2)  # fmt: skip


@pytest.mark.parametrize(
    "fields, line",
    [
        ({"crop": "center"}, "crop='center': expected 'rrc' (random-resized crop) or 'src' (DeiT III's simple"),
        ({"crop": "src", "src_padding": 32}, "src_padding=32: must be an integer in [0, image_size=32)"),
        ({"color_jitter": -0.1}, "color_jitter=-0.1: must be >= 0 (0: off; DeiT III uses 0.3)"),
        ({"repeats": 0}, "repeats=0: must be an integer >= 1 (1: off; DeiT uses 3)"),
        ({"read_workers": -1}, "read_workers=-1: must be an integer >= 0 (0: read in this process)"),
        ({"interpolation": "lanczos"}, "interpolation='lanczos': expected one of"),
    ],
)
def test_a_train_spec_checks_its_fields_where_they_are_declared(fields, line):
    with pytest.raises(UserError) as e:
        TrainSpec("/data", 8, 32, seed=0, **fields)
    assert str(e.value).startswith(line)


def test_a_val_spec_checks_its_crop():
    with pytest.raises(UserError, match=r"crop_pct=1.5: must be in \(0, 1\]"):
        ValSpec("/data", 8, 32, crop_pct=1.5)
    with pytest.raises(UserError, match=r"patch_size=0: must be an integer >= 1"):
        ValSpec("/data", 8, 32, rect_val=True, patch_size=0)


def test_specs_are_made_once_from_the_config_and_the_phase():
    """Each phase's loaders get its micro batch, sizes, crop scale and stream seed; the rest is the config's."""
    c = demo(
        [{"epoch": 0, "image_size": 8}, {"epoch": 1, "image_size": 12, "global_batch": 64, "eval_size": 16,
                                         "crop_scale": (0.5, 1.0)}],
        micro_batch=16,
    )  # fmt: skip
    c.data.path, c.data.color_jitter, c.train.seed = "/data", 0.3, 11
    p0, p1 = make_plan(c, 1, DEMO_TRAIN_EXAMPLES).phases
    t1, v1 = train_spec(c, p1), val_spec(c, p1)
    assert (t1.batch_size, t1.image_size, t1.crop_scale, t1.seed) == (16, 12, (0.5, 1.0), stream_seed(11, 1))
    assert (v1.batch_size, v1.image_size, v1.crop_pct) == (16, 16, c.data.val_crop_pct)
    assert t1.color_jitter == 0.3 and t1.data_dir == "/data" and t1.mean == tuple(c.data.mean)
    assert train_spec(c, p0, fresh_at=37).seed == stream_seed(11, 0, 37)
    assert train_spec(c).seed == 11 and train_spec(c).image_size == c.data.image_size  # no phase: the config's
    assert val_spec(c, image_size=24).image_size == 24
    assert (v1.rect_val, v1.patch_size) == (False, 4)  # the patch rectangular crops round to
    c.train.phases[1] = dict(c.train.phases[1].to_dict(), rect_val=True)
    validate(c)
    p0, p1 = make_plan(c, 1, DEMO_TRAIN_EXAMPLES).phases
    assert (val_spec(c, p0).rect_val, val_spec(c, p1).rect_val, val_spec(c).rect_val) == (False, True, False)


def test_the_data_state_writes_the_released_bytes_and_reads_every_released_form():
    released = f'{{"version": {STATE_VERSION}, "phase": 1, "phases": "abc", "loader": "{{\\"x\\": 1}}"}}'
    state = DataState(1, "abc", '{"x": 1}')
    assert state.to_json() == released and DataState.from_json(released) == state
    fresh = DataState(1, "abc", "s", fresh_at=37)
    assert fresh.to_json().endswith(', "fresh_at": 37}') and DataState.read(fresh.to_json()) == fresh
    # A loader's own state (a run without phases, before every run had one) is phase 0's under no phase list.
    own = json.dumps({"version": STATE_VERSION, "fingerprint": "f", "dali": "AA=="})
    assert DataState.read(own) == DataState(0, NO_PHASES, own)
    crafted = (  # a rank file from elsewhere, its records made to agree: each value of another type
        '{"phase": 1e999, "loader": "s"}',  # int() of it raised OverflowError: a traceback on every rank
        '{"phase": true, "loader": "s"}',
        '{"phase": -1, "loader": "s"}',
        '{"phase": 0, "loader": 5}',
        '{"phase": 0, "phases": [], "loader": "s"}',
        '{"phase": 0, "loader": "s", "fresh_at": 1.5}',
    )
    for bad in ("[1]", "{", '{"phase": 1}', '{"phase": "one", "loader": "s"}', *crafted):
        assert DataState.read(bad) is None
        with pytest.raises(ValueError):
            DataState.from_json(bad)
    assert DataState.read(None) is None and DataState.read("") is None


def test_augmentation_knobs_take_their_config_fields_default_and_rule():
    """A knob (`vitlarge.data.spec.knob`) is declared once, in the schema: the spec takes its default and rule."""
    from vitlarge.config.schema import DataConfig
    from vitlarge.data.spec import knobs

    assert knobs() == ["three_augment", "color_jitter", "hw_decoder_load", "rrc_decode"]
    spec = TrainSpec("/data", 8, 32, seed=7)
    assert [getattr(spec, k) for k in knobs()] == [getattr(DataConfig(), k) for k in knobs()]
    # A knob's value hashes as its declared type: 1 and 1.0 are one setting.
    assert TrainSpec("/data", 8, 32, seed=7, color_jitter=1).fingerprint(0, 1, SHARDS) == TrainSpec(
        "/data", 8, 32, seed=7, color_jitter=1.0
    ).fingerprint(0, 1, SHARDS)
