"""One optimizer step through the real Booster (TorchDDPPlugin, gloo, one process) on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from vitlarge.config.load import load_recipe
from vitlarge.plan.plan import make_plan
from vitlarge.train.assemble import build


@pytest.fixture(scope="module", autouse=True)
def one_thread_group(process_group):
    """A gloo group of one, as train.py makes it (tests/helpers/process_group.py), on one thread."""
    torch.set_num_threads(1)


def make_engine(precision="fp32", global_batch=32, micro_batch=8, clip=1.0, mixup=0.0, init_scale=2.0**16):
    """The engine as train.py builds it (`vitlarge.train.assemble.build`), for the demo recipe on CPU."""
    cfg = load_recipe("recipes/demo_digits.py")
    cfg.train.precision, cfg.train.global_batch, cfg.train.micro_batch = precision, global_batch, micro_batch
    cfg.train.init_loss_scale = init_scale
    cfg.optim.clip_grad_norm = clip
    cfg.augment.mixup_alpha = mixup
    cfg.schedule.warmup_epochs = 0
    return build(cfg, make_plan(cfg, 1, 1437), "cpu").engine


def batches(n: int, micro: int, poison_at: int | None = None):
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(micro, 3, 16, 16, generator=g), torch.randint(0, 10, (micro,), generator=g)) for _ in range(n)]
    if poison_at is not None:
        data[poison_at][0][0, 0, 0, 0] = float("inf")
    it = iter(data)
    return lambda: next(it)


def params(engine) -> list[torch.Tensor]:
    return [p.detach().clone() for p in engine.model.parameters()]


def test_accumulation_equals_one_big_batch():
    """4 micro-batches of 8 under no_sync give the same update as one batch of 32 (fp32, no dropout)."""
    a = make_engine(global_batch=32, micro_batch=8)
    b = make_engine(global_batch=32, micro_batch=32)
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
