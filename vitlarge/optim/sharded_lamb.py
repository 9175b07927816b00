"""LAMB over FSDP2's sharded parameters that is the same optimizer as unsharded LAMB.

Under FSDP2 (`vitlarge.distributed.fsdp`) every parameter and gradient is a ``DTensor`` sharded on dim 0: each
rank holds a run of rows of the tensor (possibly none). Moments and update directions are
elementwise, so they are computed on the local pieces (``to_local()``: plain tensors, torch's fused
Adam kernel and ``_foreach`` ops, no DTensor dispatch); the moments are stored as DTensors like
their parameters (so ``torch.distributed.checkpoint.state_dict`` can gather or re-shard them). Only
the trust ratio ``||w|| / ||u||`` needs the whole tensor: `ShardedLamb` computes the squared norms of
every local piece, sums them over the ranks in ONE all-reduce per step (a ``2 x T`` fp32 tensor,
T = tensors with a trust ratio), then applies the per-tensor ratios: the update equals
`vitlarge.optim.lamb.Lamb`'s on the unsharded model up to float summation order, whatever the world
size. Cost: the update directions of this rank's shard are held until the all-reduce (one
shard-sized buffer instead of one reused chunk), in the ``chunked`` form (directions computed chunk by chunk)
as in ``foreach`` (all at once). The ``compiled`` form holds none: its second pass recomputes them, and the
all-reduce sums the first pass's ``2 x T`` squares (every tensor's) between the two passes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from vitlarge.optim.lamb import Lamb, trust_ratio


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's piece of ``t`` (a view: in-place ops on it update ``t``), or ``t`` itself if not a DTensor."""
    return t.to_local() if isinstance(t, DTensor) else t


class ShardedLamb(Lamb):
    """`Lamb` whose trust ratios use the norms of whole tensors summed over the default process group.

    Every rank must call ``step()`` (it is a collective), with the same parameter groups in the
    same order (the model's parameter order)."""

    @classmethod
    def like(cls, lamb: Lamb) -> ShardedLamb:
        """A ShardedLamb with ``lamb``'s parameter groups and settings (``lamb`` must not have stepped)."""
        sharded = cls(lamb.param_groups, **lamb.defaults, implementation=lamb.implementation)
        sharded.fused, sharded.chunk_numel = lamb.fused, lamb.chunk_numel
        return sharded

    def _with_grads(self, group: dict) -> dict[tuple[torch.device, torch.dtype], list]:
        """`Lamb._with_grads` over local pieces, plus each item's column key (the parameter itself)."""
        by_kind = super()._with_grads(group)
        return {
            kind: [(local(p), local(p.grad), local(m), local(v), s, p) for p, _, m, v, s in items]
            for kind, items in by_kind.items()
        }

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.implementation == "compiled":
            self._step_compiled()
        else:  # chunked: the directions computed chunk by chunk (a CPU's cache), held like foreach's
            self._step_held()
        return loss

    def _held_ratios(self, held: list[tuple[dict, list, list]]) -> list[torch.Tensor | None]:
        """The squared norms of every piece in one ``2 x T`` table (a column per parameter with a trust ratio, the
        same on every rank), summed over the ranks in one all-reduce, then each chunk's ratios."""
        column = {}  # parameter -> its column in the norm table, the same on every rank
        for group in self.param_groups:
            if group["trust_ratio"]:
                for p in group["params"]:
                    column[p] = len(column)
        device = local(self.param_groups[0]["params"][0]).device
        squares = torch.zeros(2, len(column), dtype=torch.float32, device=device)
        cols = []
        for group, chunk, updates in held:
            if not group["trust_ratio"]:
                cols.append(None)
                continue
            c = torch.tensor([column[it[5]] for it in chunk], device=device)
            squares[0, c] = torch.stack(torch._foreach_norm([it[0] for it in chunk])).float() ** 2
            squares[1, c] = torch.stack(torch._foreach_norm(updates)).float() ** 2
            cols.append(c)
        norms = self._reduce_squares(squares).sqrt()
        return [
            None if c is None else trust_ratio(norms[0, c], norms[1, c], group["max_trust_ratio"]).to(chunk[0][0].dtype)
            for (group, chunk, _), c in zip(held, cols, strict=True)
        ]

    def _reduce_squares(self, squares: torch.Tensor) -> torch.Tensor:
        """``squares`` of this rank's pieces summed over the ranks (in place): those of whole tensors."""
        if squares.numel() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(squares)
        return squares
