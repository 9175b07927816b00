"""Mixup / CutMix / label smoothing on the training device, via timm.

The trainer applies the returned ``timm.data.Mixup`` to each batch from ``TrainLoader`` (on the
same device) and trains with ``timm.loss.SoftTargetCrossEntropy``. Without mixing, label smoothing
alone is the loss's job (``timm.loss.LabelSmoothingCrossEntropy``), so this returns None.
"""

from __future__ import annotations

from vitlarge.errors import UserError


def build_mixup(mixup_alpha: float, cutmix_alpha: float, label_smoothing: float, num_classes: int):
    """A ``timm.data.Mixup`` (batch-wise, switch prob 0.5 when both are on), or None if both alphas are 0.

    Batches must have an even size (timm mixes a batch with its flip).
    """
    if mixup_alpha < 0 or cutmix_alpha < 0 or not 0 <= label_smoothing < 1:
        raise UserError(
            f"mixup_alpha={mixup_alpha}, cutmix_alpha={cutmix_alpha}, label_smoothing={label_smoothing}: "
            "alphas must be >= 0 and label_smoothing in [0, 1)"
        )
    if mixup_alpha == 0 and cutmix_alpha == 0:
        return None
    from timm.data import Mixup

    return Mixup(mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, label_smoothing=label_smoothing,
                 num_classes=num_classes, mode="batch")
