"""The model EMA (vitlarge/model/ema.py) against timm's ``ModelEmaV3``, alone and inside the engine (ddp, fsdp)."""

from __future__ import annotations

import math

import pytest
import torch
from timm.utils import ModelEmaV3

from tests.helpers import ROOT
from vitlarge.config.load import load_recipe, validate
from vitlarge.distributed.plugins import unwrap
from vitlarge.model.ema import ModelEma, ema_decay
from vitlarge.plan.plan import make_plan
from vitlarge.train.assemble import build
from vitlarge.train.settings import resolve_settings


@pytest.fixture(scope="module", autouse=True)
def one_thread_group(process_group):
    torch.set_num_threads(1)


def demo_cfg(plugin="ddp", precision="fp32", decay=0.99, warmup=False):
    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    cfg.train.plugin, cfg.train.precision, cfg.train.global_batch, cfg.train.micro_batch = plugin, precision, 16, 8
    cfg.train.ema_decay, cfg.train.ema_warmup = decay, warmup
    cfg.augment.mixup_alpha, cfg.schedule.warmup_epochs = 0.0, 0
    validate(cfg)
    return cfg


def whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


@pytest.mark.parametrize("warmup", [False, True], ids=["plain", "warmup"])
def test_100_updates_equal_timms_model_ema_v3_bitwise(warmup):
    """The same model updates (100 SGD steps of a small ViT, on random batches) drive both averages."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=48, depth=2, num_classes=10)
    theirs = ModelEmaV3(model, decay=0.99, use_warmup=warmup)
    ours = ModelEma(model, decay=0.99, warmup=warmup)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for step in range(1, 101):
        x, y = torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        theirs.update(model, step=step)
        ours.update(step)
        assert ema_decay(0.99, warmup, step) == theirs.get_decay(step)
    for k, v in theirs.module.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
        assert not torch.equal(v, model.state_dict()[k]), k  # an average, not the weights
    assert ema_decay(0.99, True, 2) == pytest.approx(1 - 2 ** (-2 / 3)) and ema_decay(0.99, True, 10**6) == 0.99


@pytest.mark.parametrize("plugin", ["ddp", "fsdp"])
def test_the_engine_updates_after_each_applied_step_as_timm_does(plugin):
    """Built as train.py builds it: after engine step i (0-based) the average is timm's ``update(step=i + 1)``
    on the same weights; under fsdp it is a DTensor sharded like each parameter."""
    cfg = demo_cfg(plugin, warmup=True)
    engine = build(cfg, make_plan(cfg, 1, 1437), resolve_settings(cfg, "cpu")).engine
    root = engine.ema.model
    plain = unwrap(
        build(
            plain_cfg := demo_cfg("ddp", decay=0.0), make_plan(cfg, 1, 1437), resolve_settings(plain_cfg, "cpu")
        ).model
    )
    plain.load_state_dict({k: whole(v) for k, v in root.state_dict().items()})
    theirs = ModelEmaV3(plain, decay=0.99, use_warmup=True)
    g = torch.Generator().manual_seed(0)
    for step in range(5):
        out = engine.step(
            step, lambda: (torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g))
        )
        assert not out.skipped
        plain.load_state_dict({k: whole(v) for k, v in root.state_dict().items()})
        theirs.update(plain, step=step + 1)
    for k, v in theirs.module.state_dict().items():
        mine = engine.ema.state_dict()[k]
        assert torch.equal(whole(mine), v), k
        if plugin == "fsdp":
            assert type(mine) is type(root.state_dict()[k]) and mine.placements == root.state_dict()[k].placements


def test_a_skipped_fp16_step_leaves_the_average_unchanged():
    cfg = demo_cfg(precision="fp16")
    engine = build(cfg, make_plan(cfg, 1, 1437), resolve_settings(cfg, "cpu")).engine
    g = torch.Generator().manual_seed(0)
    batch = [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(2)]
    it = iter(batch)
    assert not engine.step(0, lambda: next(it)).skipped
    before = {k: v.clone() for k, v in engine.ema.state_dict().items()}
    poisoned = [(x.clone(), y) for x, y in batch]
    poisoned[0][0][0, 0, 0, 0] = math.inf
    it = iter(poisoned)
    assert engine.step(1, lambda: next(it)).skipped
    assert all(torch.equal(before[k], v) for k, v in engine.ema.state_dict().items())


def test_swapped_into_evaluates_the_average_and_puts_the_weights_back():
    import timm

    model = timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=48, depth=1, num_classes=10)
    ema = ModelEma(model, decay=0.5)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(2)  # decay 0.5: halfway
    moved = {k: v.clone() for k, v in model.state_dict().items()}
    with ema.swapped_into():
        for k, v in model.state_dict().items():
            assert torch.equal(v, ema.state_dict()[k]) and not torch.equal(v, weights[k]), k
    assert all(torch.equal(v, moved[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("plugin", ["ddp", "fsdp"])
def test_an_ema_evaluation_measures_the_average_and_leaves_training_unchanged(plugin):
    """The trainer's evaluation of the average (swapped into the model) between two steps: its loss is that of
    a plain model holding the average, and the next step lands where it lands without that evaluation (FSDP2's
    root keeps its gathered parameters after a forward without backward: they must not be the average's)."""
    from vitlarge.train.validation import evaluate

    cfg = demo_cfg(plugin)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(6)]
    val = data[4:]
    finals = []
    for with_ema_eval in (False, True):
        engine = build(cfg, make_plan(cfg, 1, 1437), resolve_settings(cfg, "cpu")).engine
        it = iter(data[:4])
        engine.step(0, lambda: next(it))
        engine.step(1, lambda: next(it))
        raw = evaluate(engine.model, val, engine.precision)
        if with_ema_eval:
            with engine.ema.swapped_into():
                ema = evaluate(engine.model, val, engine.precision)
            plain = unwrap(
                build(
                    plain_cfg := demo_cfg("ddp", decay=0.0), make_plan(cfg, 1, 1437), resolve_settings(plain_cfg, "cpu")
                ).model
            )
            plain.load_state_dict({k: whole(v) for k, v in engine.ema.state_dict().items()})
            assert ema == evaluate(plain, val, engine.precision) and ema["val_loss"] != raw["val_loss"]
            assert evaluate(engine.model, val, engine.precision) == raw
        it = iter(data[:2])
        engine.step(2, lambda: next(it))
        finals.append({k: whole(v) for k, v in engine.ema.model.state_dict().items()})
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def test_the_engine_is_built_with_its_ema_and_offers_it_in_its_state():
    """The EMA is part of the engine from its construction (no attribute set afterwards), and of the state a
    checkpoint saves: the checkpointer the trainer attaches to the engine holds its model, optimizer, loss scaler
    and EMA."""
    from vitlarge.checkpoint.checkpointer import Checkpointer

    def checkpointer(cfg, engine):  # as `Trainer` attaches its engine's parts
        return Checkpointer(cfg.workdir, cfg).attach(
            engine.model, engine.optimizer, engine.precision.scaler, engine.ema
        )

    cfg = demo_cfg()
    parts = build(cfg, make_plan(cfg, 1, 1437), resolve_settings(cfg, "cpu"))
    state = checkpointer(cfg, parts.engine)._state(step=3, data="pos", lineage="/a/line")
    assert parts.engine.ema is not None and state.ema is parts.engine.ema
    assert (state.model, state.optimizer, state.scaler) == (parts.model, parts.optimizer, parts.precision.scaler)
    assert (state.step, state.data, state.lineage) == (3, "pos", "/a/line")
    off = demo_cfg(decay=0.0)
    engine = build(off, make_plan(off, 1, 1437), resolve_settings(off, "cpu")).engine
    assert checkpointer(off, engine)._state().ema is None
