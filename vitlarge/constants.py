"""ImageNet-1K's figures, shared by the config defaults and the data pipelines."""

from __future__ import annotations

IMAGENET_TRAIN_EXAMPLES = 1_281_167


IMAGENET_MEAN = (0.485, 0.456, 0.406)


IMAGENET_STD = (0.229, 0.224, 0.225)
