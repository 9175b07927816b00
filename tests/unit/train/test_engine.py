"""One optimizer step through the real Booster (TorchDDPPlugin, gloo, one process) on CPU."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.data.random_erasing import RandomErasing
from timm.loss import BinaryCrossEntropy

from tests.helpers import ROOT
from vitlarge.config.load import load_recipe, validate
from vitlarge.config.schema import Config
from vitlarge.plan.plan import make_plan
from vitlarge.train.assemble import build
from vitlarge.train.engine import augment_batch, build_criterion
from vitlarge.train.settings import resolve_settings
from vitlarge.train.validation import evaluate


@pytest.fixture(scope="module", autouse=True)
def one_thread_group(process_group):
    """A gloo group of one, as train.py makes it (tests/helpers/process_group.py), on one thread."""
    torch.set_num_threads(1)


def make_engine(
    precision="fp32", global_batch=32, micro_batch=8, clip=1.0, mixup=0.0, init_scale=2.0**16, **augment_or_optim
):
    """The engine as train.py builds it (`vitlarge.train.assemble.build`), for the demo recipe on CPU.
    ``augment_or_optim``: further ``augment.*`` / ``optim.*`` fields, e.g. ``loss="bce"``, ``layer_decay=0.75``."""
    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    cfg.train.precision, cfg.train.global_batch, cfg.train.micro_batch = precision, global_batch, micro_batch
    cfg.train.init_loss_scale = init_scale
    cfg.optim.clip_grad_norm = clip
    cfg.augment.mixup_alpha = mixup
    cfg.schedule.warmup_epochs = 0
    for key, value in augment_or_optim.items():
        setattr(cfg.augment if hasattr(cfg.augment, key) else cfg.optim, key, value)
    validate(cfg)
    return build(cfg, make_plan(cfg, 1, 1437), resolve_settings(cfg, "cpu")).engine


def batches(n: int, micro: int, poison_at: int | None = None):
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(micro, 3, 16, 16, generator=g), torch.randint(0, 10, (micro,), generator=g)) for _ in range(n)]
    if poison_at is not None:
        data[poison_at][0][0, 0, 0, 0] = float("inf")
    it = iter(data)
    return lambda: next(it)


def params(engine) -> list[torch.Tensor]:
    return [p.detach().clone() for p in engine.model.parameters()]


@pytest.mark.parametrize(
    "loss",
    [
        {},
        {"loss": "bce"},
        {"loss": "bce", "label_smoothing": 0.1, "bce_target_thresh": 0.2},
    ],
    ids=["ce", "bce", "bce_smoothed_thresholded"],
)
def test_accumulation_equals_one_big_batch(loss):
    """4 micro-batches of 8 under no_sync give the same update as one batch of 32 (fp32, no dropout):
    every loss is a mean over its micro-batch, and the engine averages the micro-batches' gradients."""
    a = make_engine(global_batch=32, micro_batch=8, **loss)
    b = make_engine(global_batch=32, micro_batch=32, **loss)
    assert a.plan.phases[0].accum_steps == 4 and b.plan.phases[0].accum_steps == 1
    micro = batches(4, 8)
    parts = [micro() for _ in range(4)]
    big = iter([(torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts]))])
    it = iter(parts)
    out_a = a.step(0, lambda: next(it))
    out_b = b.step(0, lambda: next(big))
    assert out_a.grad_norm == pytest.approx(out_b.grad_norm, rel=1e-4)
    assert float(out_a.loss) == pytest.approx(float(out_b.loss), rel=1e-5)
    for pa, pb in zip(params(a), params(b)):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-5)  # float re-association only


def test_fp16_overflow_skips_the_step_and_lowers_the_scale():
    engine = make_engine("fp16", init_scale=2.0**16)
    before = params(engine)
    out = engine.step(0, batches(4, 8, poison_at=2))
    assert out.skipped and not math.isfinite(out.grad_norm)
    assert out.loss_scale == 2.0**16 and engine.precision.loss_scale == 2.0**15
    assert all(torch.equal(a, b) for a, b in zip(before, params(engine)))
    out = engine.step(1, batches(4, 8))
    assert not out.skipped and math.isfinite(out.grad_norm)
    assert not all(torch.equal(a, b) for a, b in zip(before, params(engine)))


def test_fp16_grad_norm_is_measured_after_unscaling():
    """The logged norm is the true gradient norm (scale 2^16 removed), so clipping at 1.0 means 1.0."""
    fp16 = make_engine("fp16", clip=0.0).step(0, batches(4, 8))
    fp32 = make_engine("fp32", clip=0.0).step(0, batches(4, 8))
    assert fp16.grad_norm == pytest.approx(fp32.grad_norm, rel=0.05)
    assert fp16.grad_norm < 100


def test_clipping_bounds_the_update_norm():
    """With clip 1e-3 the applied gradient has norm 1e-3: LAMB's direction is the same as unclipped but its
    moments differ, so compare the first-moment state, which is (1-beta1) * clipped grad after step 1."""
    engine = make_engine("fp32", clip=1e-3)
    out = engine.step(0, batches(4, 8))
    assert out.grad_norm > 1e-3
    state = engine.torch_optimizer.state
    m = [state[p]["exp_avg"] for p in engine.model.parameters() if p in state]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in m]))
    assert float(total) == pytest.approx(0.1 * 1e-3, rel=1e-3)


def test_bf16_non_finite_gradients_skip_the_update():
    engine = make_engine("bf16")
    before = params(engine)
    out = engine.step(0, batches(4, 8, poison_at=0))
    assert out.skipped and out.loss_scale == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, params(engine)))


def test_mixup_runs_on_soft_targets():
    engine = make_engine("bf16", mixup=0.2)
    out = engine.step(0, batches(4, 8))
    assert math.isfinite(float(out.loss)) and not out.skipped


def _bce_by_hand(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of every logit against its target, averaged over images and classes."""
    return -(targets * F.logsigmoid(logits) + (1 - targets) * F.logsigmoid(-logits)).mean()


@pytest.mark.parametrize(
    "mix, smoothing, thresh",
    [
        ({}, 0.0, None),
        ({}, 0.1, None),
        ({}, 0.1, 0.2),  # above the smoothed off value (0.01): a threshold below it is refused by the config
        ({"mixup_alpha": 0.8}, 0.0, None),
        ({"mixup_alpha": 0.8, "cutmix_alpha": 1.0}, 0.1, None),
        ({"mixup_alpha": 0.8, "cutmix_alpha": 1.0}, 0.0, 0.0),  # DeiT III: both classes of a pair count fully
    ],
    ids=["plain", "smoothed", "smoothed_thresholded", "mixup", "mixup_cutmix_smoothed", "mixup_cutmix_thresh0"],
)
def test_bce_is_timms_binary_cross_entropy(mix, smoothing, thresh):
    """``augment.loss=bce`` against timm's ``BinaryCrossEntropy`` configured as timm's train.py does (with Mixup:
    dense targets from timm's ``Mixup``, smoothing inside it; without: index targets, smoothing in the loss),
    and against the formula on targets built by hand, to 1e-6."""
    cfg = Config()
    cfg.data.num_classes = 10
    cfg.augment.loss, cfg.augment.label_smoothing, cfg.augment.bce_target_thresh = "bce", smoothing, thresh
    for key, value in mix.items():
        setattr(cfg.augment, key, value)
    validate(cfg)
    mixup, criterion = build_criterion(cfg)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(8, 3, 16, 16, generator=g)
    labels = torch.randint(0, 10, (8,), generator=g)
    logits = 3 * torch.randn(8, 10, generator=g)
    if mix:
        reference = Mixup(**mix, label_smoothing=smoothing, num_classes=10)
        np.random.seed(0)  # timm's Mixup draws lambda and the mode from numpy
        _, targets = mixup(images.clone(), labels)
        np.random.seed(0)
        _, expected_targets = reference(images.clone(), labels)
        assert torch.equal(targets, expected_targets) and not torch.equal(targets.amax(1), torch.ones(8))
        expected = BinaryCrossEntropy(target_threshold=thresh)(logits, expected_targets)
        dense = targets
    else:
        assert mixup is None
        targets = labels
        expected = BinaryCrossEntropy(smoothing=smoothing, target_threshold=thresh)(logits, labels)
        dense = torch.full((8, 10), smoothing / 10).scatter_(1, labels[:, None], 1 - smoothing + smoothing / 10)
    if thresh is not None:
        dense = (dense > thresh).float()
    got = criterion(logits, targets)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(got, _bce_by_hand(logits, dense), rtol=0, atol=1e-6)
    assert not torch.allclose(got, F.cross_entropy(logits, labels), atol=1e-3)  # not the ce path


def test_layer_decay_scales_each_groups_lr_every_step():
    """``optim.layer_decay=0.5`` on the demo ViT (depth 4): each group steps with the schedule's lr times
    0.5 ** (5 - layer), and LAMB's trust ratio makes that the relative change of each decayed matrix."""
    engine = make_engine(layer_decay=0.5)
    model = engine.model.unwrap()
    names = {id(p): n for n, p in model.named_parameters()}
    opt = engine.torch_optimizer
    scale = {names[id(p)]: g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    assert scale["patch_embed.proj.weight"] == 0.5**5 and scale["blocks.0.attn.qkv.weight"] == 0.5**4
    assert scale["blocks.3.attn.qkv.weight"] == scale["norm.weight"] == 0.5 and scale["head.weight"] == 1.0
    data = batches(8, 8)
    for step in range(2):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        out = engine.step(step, data)
        assert out.lr == pytest.approx(engine.plan.lr_at(engine.cfg, step), rel=1e-12) and out.lr > 0
        for group in opt.param_groups:
            assert group["lr"] == pytest.approx(out.lr * group["lr_scale"], rel=1e-12)
        for name in ("blocks.0.attn.qkv.weight", "blocks.3.attn.qkv.weight", "blocks.1.mlp.fc1.weight"):
            p = dict(model.named_parameters())[name].detach()
            change = float((p - before[name]).norm() / before[name].norm())
            assert change == pytest.approx(out.lr * scale[name], rel=1e-3), name


@pytest.mark.parametrize("plugin", ["ddp", "fsdp"])
def test_a_tiny_deit3_trains_with_bce_and_layer_decay(plugin):
    """A DeiT III-shaped model (timm's ``deit3_*``: LayerScale, position embedding without the class token),
    made small through ``model.kwargs``, built as train.py builds it and trained a few steps on one batch:
    the loss falls and the LayerScale gammas (no decay, no trust ratio, lowest lr at block 0) move."""
    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    cfg.model.name = "deit3_base_patch16_224"
    cfg.model.kwargs = dict(patch_size=4, embed_dim=32, depth=2, num_heads=2)
    cfg.train.plugin, cfg.train.precision, cfg.train.global_batch, cfg.train.micro_batch = plugin, "fp32", 16, 8
    cfg.augment.loss, cfg.optim.layer_decay, cfg.optim.lr = "bce", 0.75, 1e-2
    cfg.schedule.warmup_epochs = 0
    validate(cfg)
    engine = build(cfg, make_plan(cfg, 1, 1437), resolve_settings(cfg, "cpu")).engine
    model = engine.model.unwrap()
    full = {n: p for n, p in model.named_parameters()}
    assert full["blocks.0.ls1.gamma"].shape == (32,)
    groups = {
        n: g for g in engine.torch_optimizer.param_groups for n, p in full.items() if any(p is q for q in g["params"])
    }
    assert (groups["blocks.0.ls1.gamma"]["weight_decay"], groups["blocks.0.ls1.gamma"]["trust_ratio"]) == (0.0, False)
    assert groups["blocks.0.ls1.gamma"]["lr_scale"] == pytest.approx(0.75**2)

    def whole(p):
        return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()

    gamma = whole(full["blocks.0.ls1.gamma"])
    g = torch.Generator().manual_seed(0)
    fixed = [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(2)]
    losses = []
    for step in range(6):
        it = iter(fixed)
        out = engine.step(step, lambda: next(it))
        assert not out.skipped
        losses.append(float(out.loss))
    assert losses[-1] < losses[0] and all(math.isfinite(x) for x in losses), losses
    assert not torch.equal(whole(full["blocks.0.ls1.gamma"]), gamma)


def test_layer_decay_scales_are_the_recipes_after_loading_another_runs_optimizer_state():
    """Loading an optimizer state (a resume) replaces each group's settings with the saved ones, ``lr_scale``
    included; the engine keeps the recipe's scales (read when it was built), as it keeps the recipe's schedule."""
    saved = make_engine(layer_decay=0.5)
    saved.step(0, batches(4, 8))
    engine = make_engine(layer_decay=0.25)
    recipe_scales = [g["lr_scale"] for g in engine.torch_optimizer.param_groups]
    engine.torch_optimizer.load_state_dict(saved.torch_optimizer.state_dict())
    assert [g["lr_scale"] for g in engine.torch_optimizer.param_groups] != recipe_scales  # torch took the saved ones
    out = engine.step(1, batches(4, 8))
    assert [g["lr"] for g in engine.torch_optimizer.param_groups] == pytest.approx([out.lr * s for s in recipe_scales])


def _erasing_engine(p: float, micro_batch: int = 8, mixup: float = 0.0):
    """The demo engine with ``augment.random_erase_prob=p`` and no drop path, so the torch generator between
    two micro-batches' erasing is touched by nothing else; and a list that receives every model input."""
    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    cfg.train.precision, cfg.train.global_batch, cfg.train.micro_batch = "fp32", 32, micro_batch
    cfg.model.drop_path_rate = 0.0
    cfg.augment.mixup_alpha, cfg.augment.random_erase_prob = mixup, p
    cfg.schedule.warmup_epochs = 0
    validate(cfg)
    engine = build(cfg, make_plan(cfg, 1, 1437), resolve_settings(cfg, "cpu")).engine
    seen = []
    engine.model.register_forward_pre_hook(lambda _, args: seen.append(args[0].detach().clone()))
    return engine, seen


def _seed(seed: int = 3) -> None:
    random.seed(seed)  # timm's RandomErasing draws its rectangles from Python's generator
    np.random.seed(seed)  # timm's Mixup draws lambda from numpy's
    torch.manual_seed(seed)  # and the noise from torch's


def _timm_erasing(p: float) -> RandomErasing:
    return RandomErasing(probability=p, mode="pixel", max_count=1, device="cpu")


def _timm_prefetcher(images: torch.Tensor, labels: torch.Tensor, p: float, alpha: float):
    """timm's train.py default path (its prefetcher) on one batch: Mixup in the loader, then the real
    ``PrefetchLoader`` (identity normalisation: the batch is already normalised) erasing the mixed batch. timm's
    ``FastCollateMixup`` mixes uint8 images (rounded); Mixup here mixes the same floats vitlarge does."""
    from timm.data.loader import PrefetchLoader

    mixed = Mixup(mixup_alpha=alpha, num_classes=10)(images, labels)
    identity = PrefetchLoader(
        [mixed], mean=(0.0,) * 3, std=(1 / 255,) * 3, device=torch.device("cpu"), re_prob=p, re_mode="pixel"
    )
    return next(iter(identity))


def test_augment_batch_erases_after_mixup_as_timms_prefetcher():
    """`augment_batch` (what the engine runs) equals timm's default order on the same batch and generators:
    Mixup, then RandomErasing of the mixed batch; erasing first (timm's --no-prefetcher order, vitlarge's before
    issue 35) gives other images."""
    x, y = batches(1, 32)()
    mixup, erase = Mixup(mixup_alpha=0.8, num_classes=10), _timm_erasing(1.0)
    _seed()
    got, targets = augment_batch(x.clone(), y.clone(), mixup, erase)
    _seed()
    expected, expected_targets = _timm_prefetcher(x.clone(), y.clone(), 1.0, 0.8)
    assert torch.equal(got, expected) and torch.equal(targets, expected_targets)
    _seed()
    erased_first, _ = mixup(_timm_erasing(1.0)(x.clone()), y.clone())
    assert not torch.equal(erased_first, expected)  # the old order differs
    images, labels = augment_batch(x, y, None, None)
    assert images is x and labels is y  # neither: the batch as it came


def test_random_erasing_is_timms_after_mixup_in_the_step():
    """The model sees timm's RandomErasing of timm's Mixup of the batch (timm's prefetcher order): every image of
    the mixed batch gets its rectangle (p=1), partners included."""
    engine, seen = _erasing_engine(1.0, micro_batch=32, mixup=0.8)
    x, y = batches(1, 32)()
    _seed()
    engine.step(0, lambda: (x.clone(), y.clone()))
    _seed()
    expected, _ = _timm_prefetcher(x.clone(), y.clone(), 1.0, 0.8)
    assert torch.equal(seen[0], expected)
    _seed()
    mixed, _ = Mixup(mixup_alpha=0.8, num_classes=10)(x.clone(), y.clone())
    assert all(not torch.equal(expected[i], mixed[i]) for i in range(32))  # p=1: every image has its rectangle


def test_each_micro_batch_is_erased_on_its_own_and_evaluation_never():
    """Under accumulation (4 x 8) the same images in every micro-batch get four different draws, each equal
    to timm's RandomErasing applied to the micro-batches in turn; evaluation forwards the batch untouched."""
    engine, seen = _erasing_engine(0.5)
    assert engine.plan.phases[0].accum_steps == 4
    x, y = batches(1, 8)()
    _seed()
    engine.step(0, lambda: (x.clone(), y.clone()))
    _seed()
    erase = _timm_erasing(0.5)
    assert all(torch.equal(got, erase(x.clone())) for got in seen)
    assert all(not torch.equal(seen[i], seen[j]) for i in range(4) for j in range(i))
    erased = sum(not torch.equal(seen[m][i], x[i]) for m in range(4) for i in range(8))
    assert 0 < erased < 32  # p=0.5 erases some images, not all
    seen.clear()
    evaluate(engine.model, [(x.clone(), y.clone())], engine.precision)
    assert len(seen) == 1 and torch.equal(seen[0], x)


def test_random_erase_prob_zero_builds_no_erasing():
    engine, seen = _erasing_engine(0.0)
    assert engine.erase is None
    x, y = batches(1, 8)()
    engine.step(0, lambda: (x.clone(), y.clone()))
    assert all(torch.equal(got, x) for got in seen)
