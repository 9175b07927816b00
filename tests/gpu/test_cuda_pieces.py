"""The CUDA branches of vitlarge's own pieces, in this process, over NCCL at world size 1.

Device and backend choice, ``precision=auto``'s CUDA branch, the engine train.py builds (Colossal-AI's Booster,
TorchDDPPlugin) stepping on the GPU with one gradient all-reduce per step, GradScaler's overflow skip, and the
object collectives (`vitlarge.distributed.collective`) that NCCL runs through the current CUDA device.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness.loop import build_parts, make_batches
from benchmarks.harness.recipe import bench_config
from tests.gpu.conftest import needs
from vitlarge.distributed.launcher import DistEnv, free_port
from vitlarge.distributed.process import choose_device, init_distributed


@pytest.fixture(scope="module")
def nccl_group():
    device, backend = choose_device("auto")
    init_distributed(DistEnv(0, 1, 0, "127.0.0.1", free_port(), "single"), backend)
    yield device
    dist.destroy_process_group()


def test_device_auto_is_the_gpu_with_nccl(record_property):
    device, backend = choose_device("auto")
    assert (device.type, backend) == ("cuda", "nccl")
    assert torch.cuda.current_device() == device.index
    record_property("shows", f"train.device=auto -> {device} with {backend} ({torch.cuda.get_device_name(device)})")


def test_precision_auto_on_this_gpu(record_property):
    from vitlarge.model.precision import choose_precision

    name, why = choose_precision("auto", torch.device("cuda", 0))
    major, minor = torch.cuda.get_device_capability()
    assert name == ("bf16" if major >= 8 else "fp16"), (name, why)
    record_property("shows", f"compute capability {major}.{minor}: precision auto -> {name} ({why})")


def _collectives(rank: int, world: int, port: int) -> None:
    from vitlarge.distributed.collective import agree, gather, rank0_decides

    torch.cuda.set_device(rank)
    init_distributed(DistEnv(rank, world, rank, "127.0.0.1", port, "single"), "nccl")
    assert rank0_decides(lambda: {"rank": dist.get_rank()}) == {"rank": 0}
    assert agree(lambda: 3) == 3
    assert gather(rank) == list(range(world))
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: NCCL refuses two ranks on one GPU")
def test_object_collectives_run_over_nccl_between_two_gpus(record_property):
    """rank0_decides, agree and gather between two GPU ranks (at world size 1 they send nothing)."""
    import torch.multiprocessing as mp

    mp.spawn(_collectives, args=(2, free_port()), nprocs=2, join=True)
    record_property("shows", "rank0_decides, agree and gather agree between 2 ranks over NCCL")


@needs("colossalai", "the engine is built with Colossal-AI's Booster, as train.py builds it")
def test_engine_steps_with_one_all_reduce_and_skips_an_overflow(nccl_group, record_property):
    """fp16 on the GPU: finite steps update the weights with one all-reduce each; a step whose gradients
    overflow (inf images) changes no weight, halves the loss scale, and the next finite step trains again."""
    cfg = bench_config(
        "demo_digits",
        {"train.precision": "fp16", "train.compile": "off", "train.device": "auto", "augment.mixup_alpha": 0.0},
    )
    parts = build_parts(cfg, 1, nccl_group)
    engine = parts.engine
    batches = make_batches(cfg, 4, device=nccl_group)
    it = iter(batches * 4)
    first = engine.step(0, lambda: next(it))
    assert not first.skipped and math.isfinite(first.grad_norm)
    assert first.allreduce_calls == 1, first.allreduce_calls
    before = [p.detach().clone() for p in engine.params]
    scale = engine.precision.loss_scale
    bad = [(torch.full_like(x, math.inf), y) for x, y in batches]
    it_bad = iter(bad * 4)
    over = engine.step(1, lambda: next(it_bad))
    assert over.skipped
    assert all(torch.equal(a, p.detach()) for a, p in zip(before, engine.params, strict=True))
    assert engine.precision.loss_scale == scale / 2
    after = engine.step(2, lambda: next(it))
    assert not after.skipped
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, engine.params, strict=True))
    record_property(
        "shows",
        f"1 all-reduce per step; the inf step skipped, weights unchanged, scale {scale:g} -> {scale / 2:g}; "
        f"the next step trained (loss {float(after.loss):.4f})",
    )


EXPANDABLE = """
from vitlarge.train.memory import configure_allocator
line = configure_allocator()
import torch
x = torch.empty(300 * 2**20, dtype=torch.uint8, device="cuda")
print(sorted({bool(s.get("is_expandable")) for s in torch.cuda.memory._snapshot()["segments"]}), line)
"""


def test_the_allocator_setting_vitlarge_makes_is_in_effect(record_property):
    """`vitlarge.train.memory.configure_allocator` before torch loads, as ``vitlarge.run.cli.main`` does: the
    CUDA caching allocator's segments are expandable; a user's own setting (either name) is kept."""
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT

    def segments(**env) -> str:
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
        r = subprocess.run(
            [sys.executable, "-c", EXPANDABLE], cwd=ROOT, env=clean | env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.strip().splitlines()[-1]

    ours = segments()
    users = segments(PYTORCH_ALLOC_CONF="expandable_segments:False")
    assert ours.startswith("[True]"), ours
    assert users.startswith("[False]") and "(yours)" in users, users
    record_property("shows", f"vitlarge's setting: segments expandable {ours}; the user's: {users}")


def test_lamb_forms_agree_on_the_gpu_and_the_compiled_one_compiles(record_property):
    """``optim.implementation``'s three forms over a 4-block ViT-S/16's parameters (52 tensors, two groups) on the
    GPU, 3 steps from the same weights and gradients: ``foreach`` (CUDA's ``auto``) equals ``chunked`` bit for
    bit; ``compiled`` (Inductor's Triton kernels) within fp32 rounding, 1e-6 of each tensor's scale (its own
    order of operations; 1.7e-7 on a CPU). Records each form's step time and the compiled one's first step
    (its compile). The CPU suite checks the compiled form's arithmetic uncompiled (Inductor takes minutes there)."""
    import time

    import timm

    from vitlarge.config.schema import OptimConfig
    from vitlarge.optim.lamb import build_optimizer

    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", depth=4).cuda()
    grads = [[torch.randn_like(p) * 1e-2 for p in model.parameters()] for _ in range(3)]
    weights, times = {}, {}
    for form in ("chunked", "foreach", "compiled"):
        copy = timm.create_model("vit_small_patch16_224", depth=4).cuda()
        copy.load_state_dict(model.state_dict())
        opt = build_optimizer(copy, OptimConfig(lr=1e-2, weight_decay=0.05), form)
        spent = []
        for step_grads in grads:
            for p, g in zip(copy.parameters(), step_grads):
                p.grad = g.clone()
            torch.cuda.synchronize()
            t = time.perf_counter()
            opt.step()
            torch.cuda.synchronize()
            spent.append(time.perf_counter() - t)
        weights[form], times[form] = [p.detach().clone() for p in copy.parameters()], spent
    assert all(torch.equal(a, b) for a, b in zip(weights["chunked"], weights["foreach"]))
    worst = max(
        ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()
        for a, b in zip(weights["compiled"], weights["chunked"])
    )
    assert worst <= 1e-6, worst
    record_property(
        "shows",
        f"foreach == chunked bitwise; compiled within {worst:.1e}; last step ms: "
        + ", ".join(f"{f} {t[-1] * 1e3:.2f}" for f, t in times.items())
        + f"; compiled first step (compile) {times['compiled'][0]:.1f} s",
    )
