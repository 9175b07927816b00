"""train.plugin=fsdp (FSDP2) at world size 2 (each rank holds about half of every parameter's rows),
real gloo processes: what bf16 computes in, the fp16 loss scaler when only ONE rank overflows,
activation checkpointing, and the initial broadcast of rank 0's weights.

At world size 1 the cross-rank parts (the found_inf reduction, the sharded gradients) never run; so
one spawned 2-rank job measures everything once (`results`) and each test asserts one claim on what
it recorded.
"""

from __future__ import annotations

import hashlib
import os
import time

import pytest
import torch
import torch.distributed as dist

from tests.helpers.precision import LayerNormDtypes
from tests.helpers.spawn import exit_worker, free_port, spawn

RECIPE = "recipes/demo_digits.py"
WORLD = 2
DEPTH = 4  # the demo ViT's blocks
OVERFLOW_STEP = 1  # fp16 steps 0..2; rank 1 alone sees an inf gradient at this one


def built(precision: str, **train):
    from vitlarge.config.load import load_recipe
    from vitlarge.plan.plan import make_plan
    from vitlarge.train.assemble import build
    from vitlarge.train.settings import resolve_settings

    cfg = load_recipe(RECIPE)
    cfg.train.plugin, cfg.train.precision, cfg.train.global_batch = "fsdp", precision, 16 * WORLD
    cfg.augment.mixup_alpha = 0.0  # any batch size; no draw from the global RNGs
    for k, v in train.items():
        setattr(cfg.train, k, v)
    return build(cfg, make_plan(cfg, WORLD, 1437), resolve_settings(cfg, "cpu"))


def batches(rank: int, n: int = 16):
    g = torch.Generator().manual_seed(rank)  # each rank its own data, as in training
    return lambda: (torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g))


def full_weights(model) -> dict[str, torch.Tensor]:
    """The unsharded parameters (a collective: every rank calls it), gathered by DTensor, not our code."""
    return {k: p.detach().full_tensor() for k, p in model.unwrap().named_parameters()}


def digest(weights: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(weights):
        h.update(k.encode() + weights[k].float().numpy().tobytes())
    return h.hexdigest()


def _bf16(rank: int) -> dict:
    from timm.models.vision_transformer import Block

    parts = built("bf16")
    seen = {"norm": set(), "block": set(), "linear": set(), "logits": set()}

    def record(kind, inputs=True):
        def hook(module, args, output):
            seen[kind].add((str(args[0].dtype) if inputs else None, str(output.dtype)))

        return hook

    root = parts.model.unwrap()
    for m in root.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.register_forward_hook(record("norm"))  # what the LayerNorm gets and what the next layer gets
        elif isinstance(m, Block):
            m.register_forward_hook(record("block"))  # the residual stream between blocks
        elif isinstance(m, torch.nn.Linear) and m is not root.head:
            m.register_forward_hook(record("linear"), prepend=True)
    root.head.register_forward_hook(record("logits"))
    with LayerNormDtypes() as norms:
        out = parts.engine.step(0, batches(rank))
    seen["norm_compute"] = norms.seen
    return dict(seen=seen, skipped=out.skipped, allreduce_calls=out.allreduce_calls)


def _fp16_overflow_on_one_rank(rank: int) -> dict:
    # fp16 matmuls crawl on CPUs without fp16 units: 2 images per rank and micro-step.
    parts = built("fp16", init_loss_scale=2.0**10, loss_scale_growth_interval=1000, micro_batch=2, global_batch=4)
    scaler = parts.precision.scaler
    assert type(scaler) is torch.amp.GradScaler  # DTensor gradients: found_inf is reduced over the mesh
    real_unscale = scaler.unscale_
    poisoned = {"step": None}

    def unscale_(optimizer):  # the fault, injected at the edge: rank 1's own gradient shard overflows
        if rank == 1 and poisoned["step"] == OVERFLOW_STEP:
            grads = [
                p.grad.to_local()
                for g in optimizer.param_groups
                for p in g["params"]
                if p.grad is not None and p.grad.to_local().numel()
            ]
            grads[0].view(-1)[0] = float("inf")
        return real_unscale(optimizer)

    scaler.unscale_ = unscale_
    records, digests = [], [digest(full_weights(parts.model))]
    data = batches(rank, 2)
    for step in range(3):
        poisoned["step"] = step
        out = parts.engine.step(step, data)
        records.append({k: getattr(out, k) for k in ("skipped", "loss_scale", "grad_norm")})
        records[-1]["scale_after"] = scaler.get_scale()
        digests.append(digest(full_weights(parts.model)))
    return dict(records=records, digests=digests)


def _checkpointing(rank: int) -> dict:
    out = {}
    for ckpt in (False, True):
        from vitlarge.config.load import load_recipe
        from vitlarge.plan.plan import make_plan
        from vitlarge.train.assemble import build
        from vitlarge.train.settings import resolve_settings

        cfg = load_recipe(RECIPE)
        cfg.train.plugin, cfg.train.precision, cfg.train.global_batch = "fsdp", "fp32", 16 * WORLD
        cfg.train.activation_checkpointing = "full" if ckpt else "off"
        cfg.augment.mixup_alpha = 0.0
        parts = build(cfg, make_plan(cfg, WORLD, 1437), resolve_settings(cfg, "cpu"))
        assert parts.model.unwrap().grad_checkpointing == ckpt
        grads = {}

        def keep_grads(optimizer, args, kwargs):  # this rank's gradient shards as the optimizer sees them
            for n, p in parts.model.unwrap().named_parameters():
                if p.grad is not None:
                    grads[n] = p.grad.to_local().detach().clone()

        parts.engine.torch_optimizer.register_step_pre_hook(keep_grads)
        step = parts.engine.step(0, batches(rank))
        out[ckpt] = dict(grad_norm=step.grad_norm, grads=grads, weights=full_weights(parts.model))
    return out


def _initial_broadcast(rank: int) -> dict:
    from vitlarge.config.load import load_recipe
    from vitlarge.distributed.fsdp import FSDPPlugin
    from vitlarge.model.vit import build_model

    cfg = load_recipe(RECIPE)
    torch.manual_seed(rank)  # a rank-dependent draw before the build: rank 0's weights must win
    model = FSDPPlugin("fp32", torch.device("cpu")).configure(build_model(cfg))[0]
    return dict(digest=digest(full_weights(model)))


def _worker(rank: int, port: int, out: str) -> None:
    from vitlarge.distributed.launcher import DistEnv
    from vitlarge.distributed.process import init_distributed

    torch.set_num_threads(1)
    init_distributed(DistEnv(rank, WORLD, rank, "127.0.0.1", port, "test"), "gloo", collective_timeout_s=120)
    t0 = time.perf_counter()
    import vitlarge.distributed.fsdp  # noqa: F401  (torch, timm, Colossal-AI, DALI: timed apart)
    import vitlarge.train.assemble  # noqa: F401

    result = {"import_s": time.perf_counter() - t0}
    for name, fn in (
        ("broadcast", _initial_broadcast),
        ("bf16", _bf16),
        ("fp16", _fp16_overflow_on_one_rank),
        ("checkpointing", _checkpointing),
    ):
        t0 = time.perf_counter()
        result[name] = fn(rank)
        result[name + "_s"] = time.perf_counter() - t0
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()
    exit_worker()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("fsdp_precision")
    spawn(_worker, WORLD, free_port(), str(out), timeout=600, what="the 2-rank fsdp job")
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    print({k: round(v, 1) for k, v in ranks[0].items() if k.endswith("_s")})
    return ranks


def test_every_rank_starts_from_rank_0s_weights(results):
    from vitlarge.config.load import load_recipe
    from vitlarge.model.vit import build_model

    torch.manual_seed(0)
    ref = digest({k: p.detach() for k, p in build_model(load_recipe(RECIPE)).named_parameters()})
    assert [r["broadcast"]["digest"] for r in results] == [ref, ref]


def test_bf16_under_fsdp_keeps_the_residual_stream_in_bf16_and_layernorm_in_fp32(results):
    """What docs/FSDP.md says: LayerNorm computes in fp32 (input, weight and bias cast up inside, output
    cast back to bf16 for the next layer); every Linear, every block's output (the residual stream) and
    the logits are bf16."""
    bf16, fp32 = str(torch.bfloat16), str(torch.float32)
    for r in results:
        seen = r["bf16"]["seen"]
        assert seen["norm_compute"] == {(fp32, fp32, fp32)}
        assert seen["norm"] == {(bf16, bf16)}
        assert seen["block"] == {(bf16, bf16)}
        assert seen["linear"] == {(bf16, bf16)}
        assert seen["logits"] == {(bf16, bf16)}
        assert not r["bf16"]["skipped"]
        assert r["bf16"]["allreduce_calls"] is None  # not counted under fsdp (docs/LOGS.md), never a false 0


def test_fp16_overflow_on_one_rank_skips_on_both_halves_the_scale_and_keeps_the_weights(results):
    a, b = (r["fp16"] for r in results)
    assert a["digests"] == b["digests"]  # the ranks agree on the unsharded weights before and after every step
    for r in (a, b):
        skipped = [x["skipped"] for x in r["records"]]
        assert skipped == [i == OVERFLOW_STEP for i in range(3)], r["records"]
        scale = [x["scale_after"] for x in r["records"]]
        assert scale == [2.0**10, 2.0**9, 2.0**9], r["records"]  # no growth (interval 1000), one halving
        d = r["digests"]  # d[i] is before step i
        assert d[OVERFLOW_STEP + 1] == d[OVERFLOW_STEP] and d[OVERFLOW_STEP] != d[0] and d[3] != d[2]


def test_activation_checkpointing_gives_the_same_gradient_shards_at_two_ranks(results):
    for r in results:
        plain, ckpt = r["checkpointing"][False], r["checkpointing"][True]
        assert plain["grads"].keys() == ckpt["grads"].keys() and plain["grads"]
        for k in plain["grads"]:
            torch.testing.assert_close(ckpt["grads"][k], plain["grads"][k], rtol=1e-6, atol=1e-8)
        assert ckpt["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-6)
        for k in plain["weights"]:
            torch.testing.assert_close(ckpt["weights"][k], plain["weights"][k], rtol=1e-6, atol=1e-7)
    sizes = [sum(g.numel() for g in r["checkpointing"][False]["grads"].values()) for r in results]
    assert sizes[0] + sizes[1] > 0 and max(sizes) < 0.75 * sum(sizes)  # each rank holds about half: sharded
