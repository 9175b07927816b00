"""train.plugin=fsdp end to end (vitlarge/fsdp.py, sharded_optim.py, sharded_checkpoint.py): real
`colossalai run` processes with gloo, real DALI, the demo recipe; and in-process checks of precision.

Parity: 20 fp32 optimizer steps of the demo ViT with ``fsdp`` equal ``ddp`` to 1e-5 relative per
tensor at world size 2 and 3 (3 splits every flat shard unevenly, so some tensors are cut between
ranks and some ranks hold none of a tensor), and so do the clipped global gradient norms of every
step. Global batch 96 = 16 x 3 x 2 = 16 x 2 x 3, clipping at 1.0 active (norms ~2).
Resume: a kill -9 of the 2-rank fsdp run after a checkpoint, then the same command, ends bitwise
equal to the uninterrupted run (which is also the parity run: one run, several assertions).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hooks.jsonl import read_metrics
from tests import launcher
from tests.launcher import assert_bitwise_equal, final_weights
from tests.reliability import assert_scaler_contract, metrics_has_step

pytestmark = pytest.mark.slow
RECIPE = "recipes/demo_digits.py"
STEPS = 20
RTOL = 1e-5


def train_args(data: str, workdir, *extra: str) -> list[str]:
    return ["--config", RECIPE, "--data", data, "--workdir", str(workdir), "train.log_every_steps=1",
            "train.precision=fp32", "train.global_batch=96", f"train.max_steps={STEPS}",
            "train.checkpoint_every_steps=8", "train.eval_every_epochs=0", *extra]


@pytest.fixture(scope="module")
def runs(demo_data, tmp_path_factory) -> dict:
    """Workdirs of the four runs ``(plugin, world)``, one after the other."""
    out = {}
    for world in (2, 3):
        for plugin in ("ddp", "fsdp"):
            workdir = tmp_path_factory.mktemp(f"{plugin}{world}")
            r = launcher.run(train_args(demo_data, workdir, f"train.plugin={plugin}"), nproc=world)
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
            out[plugin, world] = workdir
    return out


def train_records(workdir) -> list[dict]:
    return [x for x in read_metrics(str(workdir / "metrics.jsonl")) if x["event"] == "train"]


@pytest.mark.parametrize("world", [2, 3])
def test_fsdp_equals_ddp_per_tensor_and_in_the_clipped_global_norm(runs, world):
    ddp, fsdp = final_weights(runs["ddp", world]), final_weights(runs["fsdp", world])
    assert ddp.keys() == fsdp.keys()
    worst = 0.0
    for k in ddp:
        rel = float((fsdp[k] - ddp[k]).norm() / ddp[k].norm().clamp_min(1e-12))
        worst = max(worst, rel)
        assert rel < RTOL, f"{k}: relative difference {rel:.2e} at world size {world}"
    print(f"world {world}: worst per-tensor relative difference {worst:.2e}")
    a, b = train_records(runs["ddp", world]), train_records(runs["fsdp", world])
    assert [x["step"] for x in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=RTOL), (x, y)
    assert sum(x["grad_norm"] > 1.0 for x in a) > STEPS // 2  # clipping (at 1.0) was active


def test_kill_9_then_the_same_command_ends_bitwise_equal(runs, demo_data, tmp_path):
    args = train_args(demo_data, tmp_path, "train.plugin=fsdp")
    proc = launcher.start(args, nproc=2, log=tmp_path / "killed.log")
    try:
        assert launcher.wait_for(metrics_has_step(tmp_path, 11), 600, proc), (tmp_path / "killed.log").read_text()[-3000:]
    finally:
        launcher.kill_tree(proc.pid)  # SIGKILL, whole tree
        proc.wait(timeout=60)
    r = launcher.run(args, nproc=2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr and "step_0000008" in r.stdout + r.stderr
    assert_bitwise_equal(final_weights(tmp_path), final_weights(runs["fsdp", 2]))


def test_sharded_checkpoint_holds_one_optimizer_shard_per_rank_and_a_timm_loadable_export(runs):
    import timm

    ckpt = runs["fsdp", 3] / "checkpoints" / f"step_{STEPS:07d}"
    shards = sorted(p.name for p in ckpt.glob("optimizer_rank_*.pt"))
    assert shards == [f"optimizer_rank_{r:05d}.pt" for r in range(3)]
    assert not (ckpt / "optimizer.pt").exists()
    sizes = [(ckpt / s).stat().st_size for s in shards]
    assert max(sizes) < 0.5 * sum(sizes)  # each rank holds about a third of the LAMB states
    model = timm.create_model(f"local-dir:{runs['fsdp', 3] / 'model'}", pretrained=True)
    assert_bitwise_equal({k: v for k, v in model.state_dict().items()}, final_weights(runs["fsdp", 3]))


def test_resume_at_another_world_size_is_one_clear_line(runs, demo_data, tmp_path):
    ckpt = runs["fsdp", 2] / "checkpoints" / f"step_{STEPS:07d}"
    r = launcher.run(train_args(demo_data, tmp_path, "train.plugin=fsdp") + ["--resume", str(ckpt)], nproc=3)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "(exitcode: 2)" in out, out[-3000:]  # the launcher itself exits 1
    lines = [x for x in out.splitlines() if "optimizer shards for 2 processes" in x]
    assert len(lines) == 1 and lines[0].startswith("error: checkpoint") and "resume with 2 processes" in lines[0], out[-3000:]
    assert not (tmp_path / "checkpoints").exists()  # refused before the copy into this workdir


# In-process (one gloo process): what FSDP computes in, and the sharded loss scaler's contract.


@pytest.fixture(scope="module")
def process_group():
    from vitlarge.launch import DistEnv, init_distributed

    ours = not dist.is_initialized()
    if ours:
        init_distributed(DistEnv(0, 1, 0, "127.0.0.1", launcher.free_port(), "single"), "gloo")
    yield
    if ours:
        dist.destroy_process_group()


def built(precision: str, **train):
    from vitlarge.build import build
    from vitlarge.config import load_recipe, make_plan

    cfg = load_recipe(RECIPE)
    cfg.train.plugin, cfg.train.precision, cfg.train.global_batch = "fsdp", precision, 32
    cfg.augment.mixup_alpha = 0.0  # any batch size
    for k, v in train.items():
        setattr(cfg.train, k, v)
    return build(cfg, make_plan(cfg, 1, 1437), "cpu")


def batches(n: int = 16):
    g = torch.Generator().manual_seed(0)
    return lambda: (torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g))


def test_bf16_computes_in_bf16_with_fp32_layernorm_masters_and_states(process_group):
    parts = built("bf16")
    seen = {"norm": [], "linear": []}

    def record(kind):
        def hook(module, args, output):
            seen[kind].append((args[0].dtype, output.dtype))
        return hook

    for m in parts.model.modules():
        if isinstance(m, torch.nn.LayerNorm):  # prepend: before FSDP casts the output back down
            m.register_forward_hook(record("norm"), prepend=True)
        elif isinstance(m, torch.nn.Linear):
            m.register_forward_hook(record("linear"), prepend=True)
    out = parts.engine.step(0, batches())
    depth = 4
    assert len(seen["norm"]) == 2 * 2 * depth + 2  # 2 per block + final norm, forward of 2 micro-steps
    assert set(seen["norm"]) == {(torch.float32, torch.float32)}
    assert set(seen["linear"]) == {(torch.bfloat16, torch.bfloat16)}
    assert not out["skipped"] and out["loss_scale"] == 1.0
    opt = parts.engine.torch_optimizer
    assert type(opt).__name__ == "ShardedLamb"
    params = [p for g in opt.param_groups for p in g["params"]]
    assert {p.dtype for p in params} == {torch.float32}
    assert {opt.state[p]["exp_avg"].dtype for p in params if p in opt.state} == {torch.float32}


def test_fp16_sharded_scaler_skips_halves_and_grows_like_ddp(process_group):
    # fp16 matmuls are slow on a CPU without fp16 units: tiny micro-batches, few steps.
    parts = built("fp16", init_loss_scale=2.0**14, loss_scale_growth_interval=1, micro_batch=2, global_batch=4)
    assert type(parts.precision.scaler).__name__ == "ShardedGradScaler"
    records = []
    for step in range(6):  # the scale doubles every finite step until fp16 overflows, then halves
        out = parts.engine.step(step, batches(2))
        records.append({k: out[k] for k in ("skipped", "grad_norm", "loss_scale")})
    assert_scaler_contract(records, growth_interval=1)
    assert any(r["skipped"] for r in records) and not all(r["skipped"] for r in records), records


def test_activation_checkpointing_per_block_leaves_the_step_unchanged(process_group):
    """One process only (FSDP then keeps whole tensors, but wraps and hooks as at any world size)."""
    after = []
    for ckpt in (False, True):
        from vitlarge.build import build
        from vitlarge.config import load_recipe, make_plan

        cfg = load_recipe(RECIPE)
        cfg.train.plugin, cfg.train.precision, cfg.train.global_batch = "fsdp", "fp32", 32
        cfg.model.grad_checkpointing = ckpt
        cfg.augment.mixup_alpha = 0.0  # Mixup draws from the global RNGs, which the first run advanced
        parts = build(cfg, make_plan(cfg, 1, 1437), "cpu")
        assert parts.model.unwrap().module.grad_checkpointing == ckpt
        out = parts.engine.step(0, batches())
        after.append((out["grad_norm"], {k: v.clone() for k, v in parts.model.unwrap().state_dict().items()}))
    (norm_a, a), (norm_b, b) = after
    assert norm_b == pytest.approx(norm_a, rel=1e-6)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-6, atol=1e-7)


def test_a_sharded_checkpoint_missing_a_rank_shard_or_of_another_model_is_refused(runs, tmp_path):
    import shutil

    from vitlarge import checkpoint
    from vitlarge.config import load_recipe
    from vitlarge.errors import UserError
    from vitlarge.model import build_model

    ckpt = tmp_path / f"step_{STEPS:07d}"
    shutil.copytree(runs["fsdp", 3] / "checkpoints" / ckpt.name, ckpt)
    assert checkpoint.verify(ckpt) is None
    other = load_recipe(RECIPE)
    other.model.kwargs = dict(other.model.kwargs, embed_dim=48)
    with pytest.raises(UserError, match="does not match the recipe's"):
        checkpoint.check_compatible(checkpoint.read_meta(ckpt), ckpt, build_model(other), other)
    (ckpt / "optimizer_rank_00001.pt").unlink()
    assert "optimizer_rank_00001.pt" in checkpoint.verify(ckpt)  # resume passes it over / --resume refuses it
