"""DeiT III's training augmentation in DALI: simple random crop, 3-Augment and colour jitter.

The reference is ``new_data_aug_generator`` in facebookresearch/deit's ``augment.py`` (the
transform ``--ThreeAugment`` selects, ``--src`` for the crop), which works on PIL images:

    simple random crop  Resize(S) (shorter side to S, longer ``int(S * long / short)``),
                        RandomCrop(S, padding=4, padding_mode="reflect"), RandomHorizontalFlip
    3-Augment           RandomChoice([Grayscale(3), Solarize(128), GaussianBlur(radius U(0.1, 2))])
    colour jitter       ColorJitter(cj, cj, cj): brightness, contrast and saturation factors each
                        U(max(0, 1 - cj), 1 + cj), applied in a random order; no hue

Each transform is split into its random draws (``draw_*``: per-sample CPU DataNodes) and a function
that applies given draws to uint8 HWC images (``src_crop``, ``three_augment``, ``jitter``), so a
test can feed DeiT's decisions and compare pixels. The pixel ops are the PIL-matching ones of
DALI's own AutoAugment (`nvidia.dali.auto_aug.augmentations`, those vitlarge's RandAugment uses);
the blur convolves with PIL's own kernel (`blur_kernel`). The images may live on the CPU or the
GPU; the draws stay on the CPU (argument inputs; the blur kernel follows the images). The functions
that branch per sample (``three_augment``, ``jitter``) run inside a pipeline built with
``enable_conditionals=True``.
Measured differences to DeiT's PIL ops: tests/unit/data/test_deit_augment.py and docs/DATA.md.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, cast

import numpy as np
import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
from nvidia.dali.auto_aug import augmentations as a

from vitlarge.data.randaugment import as_augmentation
from vitlarge.data.spec import SRC_PADDING  # noqa: F401 (DeiT's RandomCrop(padding=4, padding_mode="reflect"))

if TYPE_CHECKING:
    from nvidia.dali.data_node import DataNode

SOLARIZE_THRESHOLD = 128  # PIL's ImageOps.solarize default: values >= 128 become 255 - value
BLUR_RADIUS = (0.1, 2.0)  # DeiT's GaussianBlur(radius_min, radius_max)
BLUR_STEP = 0.01  # grid of the drawn blur radii
BLUR_TAPS = 13  # PIL's kernel at radius 2.0: three 5-tap boxes (box radius 1.375) convolved
GRAYSCALE, SOLARIZE, BLUR = 0, 1, 2  # the order of DeiT's RandomChoice list
BRIGHTNESS, CONTRAST, SATURATION = 0, 1, 2
JITTER_ORDERS = tuple(itertools.permutations((BRIGHTNESS, CONTRAST, SATURATION)))  # 6, equally likely


def src_size(shape: DataNode, size: int) -> DataNode:
    """torchvision's ``Resize(size)`` output [H, W] for images of ``shape`` ([H, W, ...], a CPU DataNode):
    the shorter side becomes ``size``, the longer ``floor(size * long / short)``. FLOAT, shape (2,)."""
    hw = fn.cast(shape[0:2], dtype=types.DALIDataType.FLOAT)
    short = dmath.min(hw[0], hw[1])
    return dmath.floor(float(size) * hw / short)


def draw_src_offsets(resized: DataNode, size: int, padding: int = SRC_PADDING) -> DataNode:
    """RandomCrop's top-left corner in the padded image: per axis an integer uniform in
    0..(resized + 2 * padding - size). ``resized`` is `src_size`'s [H, W]. INT32, shape (2,)."""
    room = resized + float(2 * padding - size)
    u = fn.random.uniform(range=[0.0, 1.0], shape=[2])
    return fn.cast(dmath.min(dmath.floor(u * (room + 1.0)), room), dtype=types.DALIDataType.INT32)


def src_crop(
    images: DataNode,
    resized: DataNode,
    offsets: DataNode,
    size: int,
    interp: types.DALIInterpType,
    padding: int = SRC_PADDING,
) -> DataNode:
    """Resize ``images`` (uint8 HWC) to ``resized`` ([H, W]), then the ``size`` x ``size`` window at
    ``offsets`` ([top, left]) of the image reflect-padded by ``padding`` (torchvision's "reflect",
    which does not repeat the edge: DALI's ``reflect_101``). The flip stays with the caller."""
    # resize's stub allows a second output (save_attrs); without it there is one DataNode
    images = cast("DataNode", fn.resize(images, size=resized, interp_type=interp, antialias=True))
    start = offsets - padding
    return fn.slice(images, start=start, shape=[size, size], axis_names="HW", out_of_bounds_policy="reflect_101")


def blur_kernel(radius: float) -> np.ndarray:
    """PIL's ``GaussianBlur(radius)`` as one 1-D kernel of `BLUR_TAPS` taps: three box blurs of the
    fractional box radius Pillow's BoxBlur.c derives (Gwosdek et al. 2011, variance ``radius**2``),
    convolved. A sampled Gaussian of sigma ``radius`` is not the same below sigma ~0.9: it hardly blurs
    at 0.3, where PIL's kernel still has the full variance."""
    sigma2 = radius * radius / 3
    length = math.sqrt(12.0 * sigma2 + 1.0)
    whole = math.floor((length - 1.0) / 2.0)
    frac = (2 * whole + 1) * (whole * (whole + 1) - 3 * sigma2) / (6 * (sigma2 - (whole + 1) ** 2))
    box = np.array([frac] + [1.0] * (2 * whole + 1) + [frac]) / (2 * whole + 1 + 2 * frac)
    kernel = np.convolve(np.convolve(box, box), box)
    side = (BLUR_TAPS - len(kernel)) // 2
    return np.pad(kernel, side).astype(np.float32)


def blur_kernels() -> np.ndarray:
    """[bins, BLUR_TAPS]: `blur_kernel` at the radii 0.1, 0.1 + BLUR_STEP, ..., 2.0."""
    lo, hi = BLUR_RADIUS
    return np.stack([blur_kernel(lo + i * BLUR_STEP) for i in range(round((hi - lo) / BLUR_STEP) + 1)])


def draw_three_augment() -> tuple[DataNode, DataNode]:
    """Which op (`GRAYSCALE`, `SOLARIZE`, `BLUR`, equally likely) and the blur kernel, per sample: PIL's
    at a radius uniform over 0.1..2.0 in steps of `BLUR_STEP` (DeiT: continuous; the grid is finer than
    any visible difference)."""
    op = fn.random.uniform(values=[GRAYSCALE, SOLARIZE, BLUR], dtype=types.DALIDataType.INT32)
    table = blur_kernels()
    radius_bin = fn.random.uniform(values=list(range(len(table))), dtype=types.DALIDataType.INT32)
    # types.Constant is unannotated: a ScalarConstant for a scalar, a constant DataNode for an array
    return op, cast("DataNode", types.Constant(table))[radius_bin]


def three_augment(images: DataNode, op: DataNode, kernel: DataNode) -> DataNode:
    """DeiT's RandomChoice: grayscale to 3 channels, solarize at 128, or blur with ``kernel`` (a
    `blur_kernel`, per sample), per sample as ``op`` says (the kernel is unused unless the op is `BLUR`)."""
    # DataNode.__bool__ always raises (declared NoReturn), but enable_conditionals rewrites this `if` into
    # DALI's per-sample split/merge before it runs; so the checker's complaint does not apply (also in `jitter`)
    if op == GRAYSCALE:  # pyright: ignore[reportGeneralTypeIssues]
        images = as_augmentation(a.color).op(images, 0.0)  # PIL's convert("L") weights, in every channel
    elif op == SOLARIZE:  # pyright: ignore[reportGeneralTypeIssues]
        images = as_augmentation(a.solarize).op(images, SOLARIZE_THRESHOLD)
    else:
        images = _blur(images, kernel)
    return images


def _blur(images: DataNode, kernel: DataNode) -> DataNode:
    """Separable: rows, then columns, rounded once. PIL's box blurs repeat the edge pixel at every
    pass, which a mirror that repeats the edge (``reflect_1001``) follows closely."""
    if images.device == "gpu":
        kernel = kernel.gpu()
    rows = fn.filter(
        images, fn.reshape(kernel, shape=[1, BLUR_TAPS]), border="reflect_1001", dtype=types.DALIDataType.FLOAT
    )
    out = fn.filter(rows, fn.reshape(kernel, shape=[BLUR_TAPS, 1]), border="reflect_1001")
    return fn.cast(out, dtype=types.DALIDataType.UINT8)


def draw_jitter(strength: float) -> tuple[DataNode, DataNode]:
    """ColorJitter's factors [brightness, contrast, saturation], each U(max(0, 1 - s), 1 + s), and the
    order they are applied in (an index into `JITTER_ORDERS`, uniform as torchvision's randperm)."""
    factors = fn.random.uniform(range=[max(0.0, 1.0 - strength), 1.0 + strength], shape=[3])
    order = fn.random.uniform(values=list(range(len(JITTER_ORDERS))), dtype=types.DALIDataType.INT32)
    return factors, order


def jitter(images: DataNode, factors: DataNode, order: DataNode) -> DataNode:
    """Brightness, contrast and saturation by ``factors`` in the order ``JITTER_ORDERS[order]``, each
    rounded to uint8 as PIL's ImageEnhance does between torchvision's steps."""
    for position in range(3):
        op = fn.lookup_table(
            order,
            keys=list(range(len(JITTER_ORDERS))),
            values=[o[position] for o in JITTER_ORDERS],
            dtype=types.DALIDataType.INT32,
        )
        # a per-sample `if` on a DataNode under enable_conditionals (see `three_augment`)
        if op == BRIGHTNESS:  # pyright: ignore[reportGeneralTypeIssues]
            images = as_augmentation(a.brightness).op(images, factors[BRIGHTNESS])
        elif op == CONTRAST:  # pyright: ignore[reportGeneralTypeIssues]
            images = as_augmentation(a.contrast).op(images, factors[CONTRAST])
        else:
            images = as_augmentation(a.color).op(images, factors[SATURATION])
    return images
