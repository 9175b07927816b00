"""train.plugin=fsdp in one gloo process: what FSDP computes in, and the sharded loss scaler's contract.

bf16 runs its matmuls in bf16 with LayerNorm, master weights and optimizer states in fp32; fp16's
sharded scaler skips a step on overflow, halves the scale and grows it as DDP's does. The
multi-process fsdp runs (parity with ddp, kill -9, resharding) are in tests/e2e/test_fsdp.py.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from tests.helpers.fsdp import batches, built, recipe
from tests.helpers.precision import LayerNormDtypes
from tests.helpers.runs import assert_scaler_contract


def test_bf16_computes_in_bf16_with_fp32_layernorm_masters_and_states(process_group):
    parts = built("bf16")
    seen = {"norm": [], "linear": []}

    def record(kind):
        def hook(module, args, output):
            seen[kind].append((args[0].dtype, output.dtype))

        return hook

    for m in parts.model.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.register_forward_hook(record("norm"), prepend=True)
        elif isinstance(m, torch.nn.Linear):
            m.register_forward_hook(record("linear"), prepend=True)
    with LayerNormDtypes() as norms:
        out = parts.engine.step(0, batches())
    depth = 4
    assert len(seen["norm"]) == 2 * 2 * depth + 2  # 2 per block + final norm, forward of 2 micro-steps
    assert set(seen["norm"]) == {(torch.bfloat16, torch.bfloat16)}  # the residual stream stays bf16
    f32 = str(torch.float32)
    assert norms.seen == {(f32, f32, f32)}  # ... and the normalisation computes in fp32
    assert set(seen["linear"]) == {(torch.bfloat16, torch.bfloat16)}
    assert not out.skipped and out.loss_scale == 1.0
    opt = parts.engine.torch_optimizer
    assert type(opt).__name__ == "ShardedLamb"
    params = [p for g in opt.param_groups for p in g["params"]]
    assert {p.dtype for p in params} == {torch.float32} and all(isinstance(p, DTensor) for p in params)
    assert {opt.state[p]["exp_avg"].dtype for p in params if p in opt.state} == {torch.float32}


def test_fp16_sharded_scaler_skips_halves_and_grows_like_ddp(process_group):
    # fp16 matmuls are slow on a CPU without fp16 units: tiny micro-batches, few steps.
    parts = built("fp16", init_loss_scale=2.0**14, loss_scale_growth_interval=1, micro_batch=2, global_batch=4)
    assert type(parts.precision.scaler) is torch.amp.GradScaler
    records = []
    for step in range(6):  # the scale doubles every finite step until fp16 overflows, then halves
        out = parts.engine.step(step, batches(2))
        records.append({k: getattr(out, k) for k in ("skipped", "grad_norm", "loss_scale")})
    assert_scaler_contract(records, growth_interval=1)
    assert any(r["skipped"] for r in records) and not all(r["skipped"] for r in records), records


def test_layer_decay_groups_survive_fsdp_and_sharded_lamb_steps_each_with_its_lr(process_group):
    """``optim.layer_decay`` under ``train.plugin=fsdp``: the Booster's ShardedLamb keeps every layer's group
    (its parameters now FSDP2's DTensors, by name) and its ``lr_scale``; a step sets each group's lr to
    the schedule's times its scale, and moves a decayed matrix by that lr relative to its norm (the trust ratio)."""
    from vitlarge.model.vit import build_model
    from vitlarge.optim.lamb import param_groups
    from vitlarge.plan.plan import make_plan
    from vitlarge.train.assemble import build
    from vitlarge.train.settings import resolve_settings

    cfg = recipe("fp32")
    cfg.optim.layer_decay = 0.5
    parts = build(cfg, make_plan(cfg, 1, 1437), resolve_settings(cfg, "cpu"))
    opt, model = parts.engine.torch_optimizer, parts.model.unwrap()
    assert type(opt).__name__ == "ShardedLamb"
    names = {id(p): n for n, p in model.named_parameters()}
    got = [[names[id(p)] for p in g["params"]] for g in opt.param_groups]
    plain = build_model(parts.cfg, "cpu")  # the groups must be the unsharded model's
    plain_names = {id(p): n for n, p in plain.named_parameters()}
    expected = param_groups(plain, cfg.optim.weight_decay, 0.5)
    assert got == [[plain_names[id(p)] for p in g["params"]] for g in expected] and len(got) == 2 * 4 + 4
    assert [g["lr_scale"] for g in opt.param_groups] == [g["lr_scale"] for g in expected]
    assert all(isinstance(p, DTensor) for g in opt.param_groups for p in g["params"])
    qkv = dict(model.named_parameters())["blocks.0.attn.qkv.weight"]
    before = qkv.detach().full_tensor().clone()
    out = parts.engine.step(0, batches())
    assert not out.skipped and out.lr > 0
    for g in opt.param_groups:
        assert g["lr"] == pytest.approx(out.lr * g["lr_scale"], rel=1e-12)
    change = float((qkv.detach().full_tensor() - before).norm() / before.norm())
    assert change == pytest.approx(out.lr * 0.5**4, rel=1e-3)
