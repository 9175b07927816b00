"""Sharded LAMB (vitlarge/optim/sharded_lamb.py) in a gloo group of one, on FSDP2's DTensor parameters.

`ShardedLamb` must be `Lamb`: the same update on the same model. Here the shards are whole tensors
(world size 1), so this checks the DTensor plumbing (local pieces, moments stored as DTensors, the
norm table); the uneven 2- and 3-rank shards are in tests/e2e/test_sharded_lamb.py.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from tests.helpers.lamb_parity import SETTINGS, mlp, parity, uncompiled
from vitlarge.config.schema import OptimConfig
from vitlarge.optim.lamb import build_optimizer
from vitlarge.optim.sharded_lamb import ShardedLamb, local

pytestmark = pytest.mark.usefixtures("process_group")  # a gloo group of one (tests/helpers/process_group.py)


@pytest.mark.parametrize("implementation", ["chunked", "foreach", "compiled"])
def test_steps_equal_unsharded_lamb(implementation, monkeypatch):
    """Each form of ``optim.implementation`` (the compiled one's passes run uncompiled: its arithmetic, in process)
    against the default unsharded LAMB."""
    monkeypatch.setattr("vitlarge.optim.lamb.compiled_passes", uncompiled)
    diffs = parity(steps=4, implementation=implementation)
    assert all(d < 1e-6 for step in diffs for d in step.values()), diffs
    assert len(diffs[0]) == 8  # every parameter compared


def test_like_keeps_the_groups_and_settings_and_moments_are_dtensors_like_their_parameters():
    model = fully_shard(mlp())
    lamb = build_optimizer(model, OptimConfig(**SETTINGS))
    lamb.chunk_numel = 7
    sharded = ShardedLamb.like(lamb)
    assert [len(g["params"]) for g in sharded.param_groups] == [len(g["params"]) for g in lamb.param_groups]
    assert [(g["weight_decay"], g["trust_ratio"]) for g in sharded.param_groups] == [(0.1, True), (0.0, False)]
    assert (sharded.defaults, sharded.fused, sharded.chunk_numel) == (lamb.defaults, lamb.fused, 7)
    assert ShardedLamb.like(build_optimizer(model, OptimConfig(**SETTINGS), "foreach")).implementation == ("foreach")
    model(torch.randn(4, 6)).sum().backward()
    sharded.step()
    for p in model.parameters():
        assert isinstance(p, DTensor)
        moments = [v for v in sharded.state[p].values() if isinstance(v, torch.Tensor) and v.shape == p.shape]
        assert len(moments) == 2 and all(isinstance(m, DTensor) and m.placements == p.placements for m in moments)


def test_local_is_a_view_of_this_ranks_piece():
    p = fully_shard(mlp())[0].weight
    piece = local(p)
    assert not isinstance(piece, DTensor) and piece.shape == p.shape  # one rank: the whole tensor
    with torch.no_grad():
        piece.add_(1.0)  # in place on the piece is in place on the parameter
    assert torch.equal(p.detach().full_tensor(), piece)
    plain = torch.ones(3)
    assert local(plain) is plain
