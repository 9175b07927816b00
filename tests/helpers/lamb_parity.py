"""Sharded LAMB against unsharded LAMB on the same model, the same batches and the same settings.

`parity(steps)` builds a small MLP whose parameters have 1 to 5 rows (so at 2 or 3 ranks FSDP2's
dim-0 shards are uneven and some ranks hold no rows of a tensor), shards one copy with torch's
``fully_shard`` and steps it with `ShardedLamb`, steps an unsharded copy with `Lamb`, and returns the
largest relative difference of each parameter after every step (the sharded one gathered whole by
DTensor, not by our code). Every rank of the default process group calls it with the same batches.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from vitlarge.config.schema import OptimConfig
from vitlarge.optim.lamb import build_optimizer
from vitlarge.optim.sharded_lamb import ShardedLamb

SETTINGS = dict(lr=5e-2, weight_decay=0.1)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.GELU(), nn.Linear(5, 3), nn.GELU(), nn.Linear(3, 1))


def uncompiled():
    """The ``compiled`` form's two passes as plain Python, to stand in for `vitlarge.optim.lamb.compiled_passes`:
    the form's arithmetic and collectives in milliseconds, without Inductor's minute of compiling on a CPU
    (tests/e2e/test_compile_runs.py compiles them)."""
    from vitlarge.optim import lamb

    return lamb.CompiledPasses(lamb._moments_and_squares, lamb._apply_update)


def parity(steps: int = 3, implementation: str = "chunked") -> list[dict[str, float]]:
    """The plain model stepped by the default (chunked) `Lamb`, the sharded one by `ShardedLamb` in
    ``implementation``'s form."""
    plain = mlp()
    sharded = fully_shard(copy.deepcopy(plain))
    plain_opt = build_optimizer(plain, OptimConfig(**SETTINGS))
    sharded_opt = ShardedLamb.like(build_optimizer(sharded, OptimConfig(**SETTINGS), implementation))
    g = torch.Generator().manual_seed(1)  # the same batches on every rank: FSDP's mean gradient is plain's
    diffs = []
    for _ in range(steps):
        x = torch.randn(8, 6, generator=g)
        for model, opt in ((plain, plain_opt), (sharded, sharded_opt)):
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            opt.step()
        got = {n: p.detach().full_tensor() for n, p in sharded.named_parameters()}
        diffs.append(
            {
                n: ((got[n] - p.detach()).abs().max() / p.detach().abs().max()).item()
                for n, p in plain.named_parameters()
            }
        )
    return diffs
