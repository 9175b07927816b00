"""Model EMA (``train.ema_decay``): an fp32 exponential moving average of the weights, timm's ``ModelEmaV3``.

Contract:

* the average covers the model's state dict (parameters and buffers, by the unwrapped model's names); floating
  entries are averaged in fp32, others copied (timm's ``ModelEmaV3.apply_update_``, ``foreach`` path: one
  ``torch._foreach_lerp_`` with weight ``1 - decay``), so after the same model updates it is bitwise timm's;
* ``update(step)`` is called after optimizer step ``step`` (steps done, 1-based; the trainer's counter, which
  also counts skipped steps), and not after a step whose update was skipped (fp16 overflow, non-finite
  gradients: the weights did not change). The decay is timm's ``get_decay(step)`` with ``update_after_step=0``,
  ``warmup_gamma=1``, ``warmup_power=2/3``, ``min_decay=0``: with ``n = step - 1``, 0 at ``n = 0`` (the first
  update copies the weights), else ``ema_decay``, or under ``train.ema_warmup``
  ``min(ema_decay, 1 - (1 + n) ** (-2/3))`` (0.37 at n=1, 0.9 at n=31, 0.99 at n=999);
* sharding follows the model's: under fsdp each entry is a ``DTensor`` like its parameter (every rank averages
  the rows it holds, no collective; ``torch.distributed.checkpoint`` saves and re-shards it as the weights),
  under ddp each rank holds the whole average (the same on every rank, as the replicas are);
* `swapped_into` puts the average into the model for an evaluation and the weights back afterwards (bit copies).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

WARMUP_POWER = 2 / 3  # timm ModelEmaV3's warmup_power default (warmup_gamma 1)


def ema_decay(decay: float, warmup: bool, step: int) -> float:
    """timm ``ModelEmaV3.get_decay(step)`` (``update_after_step=0``, ``min_decay=0``, ``warmup_gamma=1``)."""
    n = max(0, step - 1)
    if n <= 0:
        return 0.0
    if warmup:
        return max(min(1 - (1 + n) ** -WARMUP_POWER, decay), 0.0)
    return decay


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's piece of ``t`` (a view), or ``t`` itself when it is not a DTensor."""
    return t.to_local() if isinstance(t, DTensor) else t


class ModelEma:
    """The average of ``model`` (a timm model, DDP replica or FSDP2 root: its own state dict names)."""

    def __init__(self, model: nn.Module, decay: float, warmup: bool = False):
        self.model, self.decay, self.warmup = model, decay, warmup
        self.state: dict[str, torch.Tensor] = {}
        self.reset()

    @torch.no_grad()
    def reset(self) -> None:
        """The average set to the current weights (a start, or a resume from a checkpoint without an EMA)."""
        self.state = {
            k: v.detach().to(dtype=torch.float32 if v.is_floating_point() else v.dtype, copy=True)
            for k, v in self.model.state_dict().items()
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The average by state-dict name: what a checkpoint saves and loads into (in place, sharded like the
        weights under fsdp)."""
        return self.state

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The average set to ``state_dict`` (the same names; each copied into place, so shards stay shards)."""
        for k, v in self.state.items():
            _local(v).copy_(_local(state_dict[k]))

    @torch.no_grad()
    def update(self, step: int) -> None:
        """After optimizer step ``step`` (1-based) was applied; see the module docstring."""
        weight = 1.0 - ema_decay(self.decay, self.warmup, step)
        ema, new = [], []
        for k, v in self.model.state_dict().items():
            if v.is_floating_point():
                ema.append(_local(self.state[k]))
                new.append(_local(v).float())
            else:
                _local(self.state[k]).copy_(_local(v))
        torch._foreach_lerp_(ema, new, weight=weight)

    @contextlib.contextmanager
    @torch.no_grad()
    def swapped_into(self) -> Iterator[None]:
        """The model holds the average inside the block (for an evaluation) and its own weights after it."""
        # state_dict() also reshards FSDP2 groups left unsharded (the root keeps its gathered parameters after a
        # forward without backward), so the next forward gathers what was copied here, and training afterwards
        # does not run on a gathered copy of the average.
        live = [(_local(v), _local(self.state[k])) for k, v in self.model.state_dict().items()]
        saved = [w.clone() for w, _ in live]
        for w, e in live:
            w.copy_(e)
        try:
            yield
        finally:
            self.model.state_dict()
            for (w, _), s in zip(live, saved, strict=True):
                w.copy_(s)

    @torch.no_grad()
    def full(self, rank: int) -> dict[str, torch.Tensor]:
        """The whole average on CPU on rank 0, ``{}`` elsewhere (a collective under fsdp: every rank calls it)."""
        out = {}
        for k, v in self.state.items():
            whole = v.full_tensor() if isinstance(v, DTensor) else v
            if rank == 0:
                out[k] = whole.detach().contiguous().cpu()
        return out
