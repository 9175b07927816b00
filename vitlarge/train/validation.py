"""Exact top-1 / top-5 / loss over the validation split (the trainer's evaluation and the evaluate CLI's).

Contract: every rank iterates its own shard of the split, sums are all-reduced in float64, so each
image counts once whatever the world size and batch size. Every rank runs the same number of
forwards (`ValLoader.masked`: batches of DALI's padding are forwarded and counted as nothing), as a
sharded (fsdp) model's forward is collective: a rank with one forward fewer would leave the others
waiting in an all-gather. Rectangular validation (a loader whose ``rect`` is true: an image shape per
batch, `vitlarge.data.rect`) runs a compiled model eagerly: one graph per shape would recompile a
few dozen times per pass (``train.compile``'s graphs have static shapes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from vitlarge.model.precision import Precision


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, batches: Iterable, precision: Precision, classes: Sequence[int] | None = None
) -> dict[str, Any]:
    """Returns ``val_top1``, ``val_top5`` (fractions), ``val_loss`` (mean CE) and ``val_images``.

    ``batches``: a `ValLoader` (its ``masked()`` pass is used) or any iterable of ``(images, labels)``.
    ``classes``: the model's output index of each label (`vitlarge.data.class_map`: a data set of some of the
    model's classes, or of its classes in another order); the logits are taken at those indices, so the scores
    (top-k, loss) are over the data set's classes, correct by name. None: labels are the model's indices."""
    model.eval()
    device = next(model.parameters()).device
    index = None if classes is None else torch.tensor(list(classes), dtype=torch.long, device=device)
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top1, top5, count
    masked_pass = getattr(batches, "masked", None)
    masked = masked_pass() if masked_pass is not None else ((x, y, len(y)) for x, y in batches)
    eager = torch.compiler.set_stance("force_eager") if getattr(batches, "rect", False) else contextlib.nullcontext()
    with eager:
        sums = _sums(model, masked, precision, sums, index)
    if dist.is_initialized():
        dist.all_reduce(sums)
    loss, top1, top5, n = sums.tolist()
    n = max(n, 1.0)
    return dict(val_top1=top1 / n, val_top5=top5 / n, val_loss=loss / n, val_images=int(sums[3].item()))


def _sums(
    model: torch.nn.Module, masked: Iterable, precision: Precision, sums: torch.Tensor, index: torch.Tensor | None
) -> torch.Tensor:
    """``sums`` (loss, top-1 hits, top-5 hits, count) plus those of the ``(images, labels, keep)`` batches, the
    logits taken at ``index`` where given."""
    for images, labels, keep in masked:
        # A padding-only batch is forwarded for the collectives only; real rows are forwarded alone.
        images, labels = (images, labels[:0]) if keep == 0 else (images[:keep], labels[:keep])
        with precision.autocast():
            logits = model(images)
        logits = logits.float()[: len(labels)]
        if index is not None:
            logits = logits.index_select(1, index)
        k = min(5, logits.shape[1])
        top = logits.topk(k, dim=1).indices
        hit = top.eq(labels[:, None])
        sums[0] += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").double()
        sums[1] += hit[:, 0].sum()
        sums[2] += hit.any(dim=1).sum()
        sums[3] += labels.numel()
    return sums
