"""A run's state (vitlarge/checkpoint/state.py): each part saves and loads itself through one protocol, the store
takes the whole, and what it writes is what a run always wrote (meta.json's keys in their order, the rank file's)."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import ROOT
from tests.helpers.tiny_model import make, trained
from vitlarge.checkpoint import store
from vitlarge.checkpoint.state import LoadedCheckpoint, RngState, RunState, Stateful
from vitlarge.config.load import load_recipe
from vitlarge.model.ema import ModelEma

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cfg():
    return load_recipe(ROOT / "recipes" / "demo_digits.py")


def test_every_part_but_the_sharded_pair_speaks_the_stateful_protocol(cfg):
    model, opt, scaler = make(cfg)
    state = RunState(model, opt, scaler, ModelEma(model, 0.9))
    for part in (state.scaler, state.ema, state.rng):
        assert isinstance(part, Stateful), type(part)
    assert set(state.rank_state()) == {"rng", "scaler", "data"}


def test_the_rng_state_takes_back_what_it_offered():
    rng = RngState()
    saved = rng.state_dict()
    drawn = torch.rand(3), np.random.rand(3), random.random(), random.gauss(0, 1)
    rng.load_state_dict(saved)
    again = torch.rand(3), np.random.rand(3), random.random(), random.gauss(0, 1)
    assert torch.equal(drawn[0], again[0]) and np.array_equal(drawn[1], again[1]) and drawn[2:] == again[2:]


def test_the_ema_takes_back_its_average_in_place(cfg):
    model = make(cfg)[0]
    ema = ModelEma(model, 0.9)
    tensors = ema.state_dict()
    other = {k: torch.full_like(v, 0.5) for k, v in tensors.items()}
    ema.load_state_dict(other)
    assert ema.state_dict() is tensors  # the same tensors (DCP loads into them): values copied, not replaced
    assert all(torch.equal(v, other[k]) for k, v in ema.state_dict().items())


def test_a_save_writes_meta_json_with_the_keys_a_run_always_wrote(tmp_path, cfg):
    """Byte-compatible checkpoints: meta.json's keys in the order vitlarge 0.x wrote them (``line`` included)."""
    model, opt, scaler = trained(cfg)
    path = store.save(tmp_path, RunState(model, opt, scaler, step=4, data="pos", lineage="/a/line"), cfg, keep=2)
    meta = json.loads((path / "meta.json").read_text())
    assert list(meta) == [
        "format_version",
        "step",
        "world_size",
        "model",
        "param_shapes",
        "config",
        "optimizer_state",
        "ema",
        "line",
        "files",
    ]
    assert (meta["step"], meta["line"], meta["ema"]) == (4, "/a/line", False)


def test_a_load_fills_the_parts_and_returns_a_typed_checkpoint(tmp_path, cfg):
    model, opt, scaler = trained(cfg)
    path = store.save(tmp_path, RunState(model, opt, scaler, step=4, data="pos", lineage="/a/line"), cfg, keep=2)
    m2, o2, s2 = make(cfg, seed=1)
    loaded = store.load(path, RunState(m2, o2, s2), cfg)
    assert isinstance(loaded, LoadedCheckpoint)
    assert (loaded.path, loaded.step, loaded.world_size, loaded.data_state, loaded.lineage) == (
        path,
        4,
        1,
        "pos",
        "/a/line",
    )
    assert loaded.config["model"]["name"] == cfg.model.name
    assert s2.get_scale() == scaler.get_scale()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in m2.state_dict().items())


@pytest.mark.parametrize("exact", [True, False])
def test_another_world_size_is_said_with_singular_counts_and_without_exactly_after_a_schedule_edit(cfg, exact):
    """One process to three at accumulation 1: "1 process", "1 micro-step" (not "1 processes", "1 micro-steps"); the
    lr schedule "resumes exactly" only when nothing of it changed (vitlarge/plan/edits.py says the rest)."""
    from vitlarge.plan.plan import make_plan

    cfg48 = load_recipe(ROOT / "recipes" / "demo_digits.py")
    cfg48.train.global_batch = 48  # the demo's 128 does not divide over 3 processes
    plan = make_plan(cfg48, 3, 1437)
    loaded = LoadedCheckpoint(path=Path("ckpt"), step=44, world_size=1, data_state=None)
    line = loaded.usable_data_state(cfg48, plan, schedule_exact=exact).warning
    assert line is not None and line.startswith("warning: ckpt was written by 1 process, this run has 3: ")
    assert "1 micro-step per step now" in line and "micro-steps" not in line
    assert ("resume exactly" in line) == exact
