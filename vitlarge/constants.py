"""ImageNet-1K's figures, shared by the config defaults and the data pipelines."""

from __future__ import annotations

IMAGENET_TRAIN_EXAMPLES = 1_281_167


IMAGENET_MEAN = (0.485, 0.456, 0.406)


IMAGENET_STD = (0.229, 0.224, 0.225)


IMAGENET_VAL_EXAMPLES = 50_000


IMAGENET_TRAIN_BYTES = 147_897_477_120
"""ImageNet-1K's training JPEGs: the size of ``ILSVRC2012_img_train.tar`` (image-net.org's download page, 138 GiB),
about 115 kB an image; the converter keeps RGB JPEGs as their bytes (docs/DATA.md), so its TFRecords hold about
as much."""
