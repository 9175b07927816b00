"""Activation memory of a forward: the bytes of the tensors it made that are still alive when it returns.

What a training step holds between its forward and its backward is what autograd and the activation
checkpoints kept: saved activations, a checkpoint's inputs, the matmul outputs a selective checkpoint caches.
`HeldAfterForward` records every storage an op makes while it is active (a ``TorchDispatchMode``: it sees the
ops under autograd and inside checkpoints alike) and, when asked, sums those whose storage is still alive. A
storage that existed before (parameters, their transposed views, the input) is not counted: only what the
forward made. Storages are held by weak reference, so measuring keeps nothing alive; FSDP's gathered
parameters, freed after each block by resizing their storage to 0, count 0.

This counts tensors, not the allocator: a CPU's peak RSS also has the backward's transients and the
allocator's slack (benchmarks/bench_activation_checkpointing.py measures both side by side).
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class HeldAfterForward(TorchDispatchMode):
    """``with HeldAfterForward(before) as held: loss = f(x)``, then ``held.bytes()``: what ``f`` made that lives on.

    ``before``: tensors whose storages are not the forward's (the model's parameters and buffers, the input)."""

    def __init__(self, before: list[torch.Tensor]):
        super().__init__()
        self.old = {t.untyped_storage().data_ptr() for t in before}
        self.made: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                seen = self.made.get(ptr)
                if ptr not in self.old and (seen is None or seen() is None):  # new, or at a freed one's address
                    self.made[ptr] = weakref.ref(storage)
        return out

    def bytes(self) -> int:
        alive = (ref() for ref in self.made.values())
        return sum(s.nbytes() for s in alive if s is not None)


def held_after_forward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes of what ``model``'s forward and cross-entropy loss on ``(x, y)`` keep for backward (the backward is
    then run, so the step is whole)."""
    before = [*model.parameters(), *model.buffers(), x]
    with HeldAfterForward(before) as held:
        loss = torch.nn.functional.cross_entropy(model(x), y)
    kept = held.bytes()
    loss.backward()
    return kept
