"""LAMB over sharded parameters that is the same optimizer as unsharded LAMB.

Under FSDP with ``use_orig_params`` each rank's ``nn.Parameter`` is its piece of the tensor (a view
of the unit's flat shard, possibly empty, split anywhere). Moments and update directions are
elementwise, so a piece's are the whole tensor's; only the trust ratio ``||w|| / ||u||`` needs the
whole tensor. `ShardedLamb` computes the squared norms of every local piece, sums them over the
ranks in ONE all-reduce per step (a ``2 x T`` fp32 tensor, T = tensors with a trust ratio), then
applies the per-tensor ratios: the update equals `vitlarge.optim.Lamb`'s on the unsharded model up
to float summation order, whatever the world size. Cost: the update directions of this rank's
shard are held until the all-reduce (one shard-sized buffer instead of one reused chunk).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vitlarge.optim import Lamb, trust_ratio


class ShardedLamb(Lamb):
    """`Lamb` whose trust ratios use the norms of whole tensors summed over the default process group.

    Every rank must call ``step()`` (it is a collective), with the same parameter groups in the
    same order (FSDP's views keep the model's parameter order)."""

    @classmethod
    def like(cls, lamb: Lamb) -> "ShardedLamb":
        """A ShardedLamb with ``lamb``'s parameter groups and settings (``lamb`` must not have stepped)."""
        sharded = cls(lamb.param_groups, **lamb.defaults)
        sharded.fused, sharded.chunk_numel = lamb.fused, lamb.chunk_numel
        return sharded

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        column = {}  # parameter -> its column in the norm table, the same on every rank
        for group in self.param_groups:
            if group["trust_ratio"]:
                for p in group["params"]:
                    column[p] = len(column)
        first = self.param_groups[0]["params"][0]
        squares = torch.zeros(2, len(column), dtype=torch.float32, device=first.device)
        pending = []
        for group in self.param_groups:
            for items in self._with_grads(group).values():
                for chunk in self._chunks(items):
                    updates = [torch.empty_like(it[0]) for it in chunk]
                    self._direction(group, chunk, updates)
                    params = [it[0] for it in chunk]
                    if group["trust_ratio"]:
                        cols = torch.tensor([column[p] for p in params], device=first.device)
                        squares[0, cols] = torch.stack(torch._foreach_norm(params)).float() ** 2
                        squares[1, cols] = torch.stack(torch._foreach_norm(updates)).float() ** 2
                    pending.append((group, params, updates))
        if column and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(squares)
        norms = squares.sqrt()
        for group, params, updates in pending:
            ratio = None
            if group["trust_ratio"]:
                cols = torch.tensor([column[p] for p in params], device=first.device)
                ratio = trust_ratio(norms[0, cols], norms[1, cols], group["max_trust_ratio"]).to(params[0].dtype)
            self._apply(group, params, updates, ratio)
        return loss
