"""A resume at 3 ranks continues the uninterrupted run bitwise: DDP's gradient buckets are the same from its first step.

torch's DDP all-reduces its first backward in one buffer, parameters in reverse order, then rebuilds its buckets in
the order the gradients became ready. A resumed run's first step used the first layout where the uninterrupted run
had the rebuilt one: every gradient at another offset, summed over 3+ ranks in another order (2 ranks: a+b == b+a),
so the weights left the uninterrupted run's in the last bit from the first step after a resume (the demo at 3
processes, kill -9 after step 45: losses equal to step 41, a max weight difference of 0.055 at step 87).
Here the engine as train.py builds it takes 3 fp32 steps; a second engine, built afresh and given the first one's
state after step 1 (a resume), takes steps 2 and 3: the weights must be the first engine's, bit for bit.
"""

from __future__ import annotations

import copy

import torch

from tests.helpers.spawn import exit_worker, free_port, spawn

GLOBAL, MICRO, STEPS = 48, 8, 3


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from tests.helpers.process_group import init_rank
    from vitlarge.config.load import load_recipe, validate
    from vitlarge.plan.plan import make_plan
    from vitlarge.train.assemble import build
    from vitlarge.train.settings import resolve_settings

    torch.set_num_threads(1)
    init_rank(rank, world, port)
    cfg = load_recipe("recipes/demo_digits.py")
    cfg.train.precision = "fp32"
    cfg.train.global_batch, cfg.train.micro_batch = GLOBAL, MICRO
    cfg.augment.mixup_alpha = 0.0  # Mixup draws from Python's and numpy's generators, which a resume restores
    validate(cfg)
    plan, settings = make_plan(cfg, world, 1437), resolve_settings(cfg, "cpu")
    g = torch.Generator().manual_seed(3)
    batches = [
        (torch.randn(GLOBAL, 3, 16, 16, generator=g), torch.randint(0, 10, (GLOBAL,), generator=g))
        for _ in range(STEPS)
    ]
    accum = GLOBAL // (MICRO * world)

    def take(engine, step: int) -> None:
        images, labels = batches[step]
        mine = iter(range(rank * accum, (rank + 1) * accum))  # this rank's micro-batches of the global batch

        def next_batch():
            k = next(mine)
            return images[k * MICRO : (k + 1) * MICRO], labels[k * MICRO : (k + 1) * MICRO]

        assert not engine.step(step, next_batch).skipped

    def weights(parts) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in parts.model.unwrap().named_parameters()}

    first = build(cfg, plan, settings)
    take(first.engine, 0)
    saved = copy.deepcopy((first.model.unwrap().state_dict(), first.engine.torch_optimizer.state_dict()))
    for step in range(1, STEPS):
        take(first.engine, step)
    resumed = build(cfg, plan, settings)
    resumed.model.unwrap().load_state_dict(saved[0])
    resumed.engine.torch_optimizer.load_state_dict(saved[1])
    for step in range(1, STEPS):
        take(resumed.engine, step)
    if rank == 0:
        torch.save({"uninterrupted": weights(first), "resumed": weights(resumed)}, out)
    dist.destroy_process_group()
    exit_worker()


def test_a_resume_at_3_ranks_continues_the_uninterrupted_run_bitwise(tmp_path):
    out = tmp_path / "weights.pt"
    spawn(_worker, 3, 3, free_port(), str(out), timeout=300, what="the 3-rank resume job")
    got = torch.load(out, weights_only=True)
    differ = [n for n, w in got["uninterrupted"].items() if not torch.equal(w, got["resumed"][n])]
    assert not differ, f"{len(differ)} of {len(got['resumed'])} tensors differ after the resume, first {differ[0]}"
