"""``augment.loss=bce`` and ``optim.layer_decay`` at world sizes 1, 2 and 3, under ddp and fsdp: one update.

The same 48-image global batches (micro batch 8) are cut into 6 micro-batches and dealt to the ranks
(world 1: 6 accumulation steps; 2: 3; 3: 2), and two fp32 optimizer steps are taken with the engine as
train.py builds it (`vitlarge.train.assemble.build`): BCE with label smoothing and a target threshold,
layer-wise lr decay 0.5 (groups with lr scales 1/32 ... 1), LAMB (ShardedLamb under fsdp), clipping.
The final weights equal the one-rank run's to float re-association (1e-5 relative per tensor), as the
cross-entropy runs do (tests/e2e/test_fsdp.py, tests/unit/train/test_engine.py).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.spawn import exit_worker, free_port, spawn

GLOBAL, MICRO, STEPS = 48, 8, 2


def _worker(rank: int, world: int, port: int, plugin: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from tests.helpers.process_group import init_rank
    from vitlarge.config.load import load_recipe, validate
    from vitlarge.plan.plan import make_plan
    from vitlarge.train.assemble import build
    from vitlarge.train.settings import resolve_settings

    torch.set_num_threads(1)
    init_rank(rank, world, port)
    cfg = load_recipe("recipes/demo_digits.py")
    cfg.train.plugin, cfg.train.precision = plugin, "fp32"
    cfg.train.global_batch, cfg.train.micro_batch = GLOBAL, MICRO
    cfg.augment.mixup_alpha = 0.0  # a draw per micro-batch would differ between world sizes
    cfg.augment.loss, cfg.augment.label_smoothing, cfg.augment.bce_target_thresh = "bce", 0.1, 0.05
    cfg.optim.layer_decay = 0.5
    cfg.schedule.warmup_epochs = 0
    validate(cfg)
    parts = build(cfg, make_plan(cfg, world, 1437), resolve_settings(cfg, "cpu"))
    accum = parts.engine.plan.phases[0].accum_steps
    assert accum * world * MICRO == GLOBAL
    g = torch.Generator().manual_seed(3)
    norms = []
    for step in range(STEPS):
        images = torch.randn(GLOBAL, 3, 16, 16, generator=g)
        labels = torch.randint(0, 10, (GLOBAL,), generator=g)
        mine = iter(range(rank * accum, (rank + 1) * accum))  # this rank's micro-batches of the global batch

        def next_batch():
            k = next(mine)
            return images[k * MICRO : (k + 1) * MICRO], labels[k * MICRO : (k + 1) * MICRO]

        result = parts.engine.step(step, next_batch)
        assert not result.skipped
        norms.append(result.grad_norm)
    weights = {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in parts.model.unwrap().named_parameters()
    }
    scales = sorted({g["lr_scale"] for g in parts.engine.torch_optimizer.param_groups})
    if rank == 0:
        torch.save({"weights": weights, "norms": norms, "scales": scales}, out)
    dist.destroy_process_group()
    exit_worker()


def _run(tmp_path, plugin: str, world: int) -> dict:
    out = tmp_path / f"{plugin}{world}.pt"
    spawn(_worker, world, world, free_port(), plugin, str(out), timeout=300, what=f"the {plugin}@{world} job")
    return torch.load(out, weights_only=True)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> dict:
    return _run(tmp_path_factory.mktemp("ddp1"), "ddp", 1)


@pytest.mark.parametrize("plugin, world", [("ddp", 2), ("fsdp", 3)])
def test_bce_with_layer_decay_is_one_update_at_any_world_size(one_rank, tmp_path, plugin, world):
    got = _run(tmp_path, plugin, world)
    assert got["scales"] == one_rank["scales"] == [0.5**k for k in range(5, -1, -1)]
    assert got["norms"] == pytest.approx(one_rank["norms"], rel=1e-5)
    ref = one_rank["weights"]
    assert got["weights"].keys() == ref.keys()
    for name, w in ref.items():
        rel = float((got["weights"][name] - w).norm() / w.norm().clamp_min(1e-12))
        assert rel < 1e-5, f"{name}: relative difference {rel:.2e} ({plugin} at {world} ranks)"
