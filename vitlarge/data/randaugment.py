"""timm's RandAugment in DALI: the same ops, magnitudes and per-op probability as timm's strings.

    spec("rand-m9-mstd0.5-inc1")   -> RandAugmentSpec (or None for None / "")
    apply(images, spec, shape)     -> the augmented DataNode, inside a DALI pipeline
    op_table(spec)                 -> [(timm op name, DALI augmentation)], what ``apply`` samples from

A string means what ``timm.data.rand_augment_transform`` makes of it (timm 1.0): ``n`` layers,
each picks one op uniformly (with replacement) from timm's list (``_RAND_TRANSFORMS``, or
``_RAND_INCREASING_TRANSFORMS`` with ``inc1``) and applies it with probability ``p`` (0.5) at
magnitude ``m`` on timm's 0..10 scale (m9 = 9/10 of each op's range: 27 degrees of rotation).
``mstd`` draws the magnitude per application from N(m, mstd) (uniform 0..m when > 100),
clipped to 0..``mmax`` (default 10). Parts timm has no meaning for, or that DALI cannot do
(``t<name>`` op sets, the removed ``w`` weights), are a UserError naming the part.

Every op's magnitude table is timm's ``level_to_arg`` evaluated on a grid of ``STEPS`` bins per
magnitude unit, so an integer ``m`` is exact and a random magnitude (``mstd``) is rounded to
0.1. Differences that remain are listed in docs/DATA.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, TypedDict, cast

import numpy as np

from vitlarge.errors import UserError

if TYPE_CHECKING:
    import numpy.typing as npt
    from nvidia.dali.auto_aug.core import _Augmentation as Augmentation  # DALI's public alias of its class
    from nvidia.dali.data_node import DataNode
    from typing_extensions import Unpack  # typing.Unpack is 3.11+

    # What pyright infers for an op of nvidia.dali.auto_aug.augmentations, each an Augmentation: DALI's
    # @augmentation decorator has no return annotation (its two uses, bare and with arguments, give the last two).
    _Decorated: TypeAlias = "Augmentation | DataNode | Callable[..., Augmentation]"

LEVEL_DENOM = 10  # timm's _LEVEL_DENOM: m10 is the full range of an op
STEPS = 10  # magnitude bins per unit of m: random magnitudes are rounded to 0.1
FILL = 128  # timm's img_mean fill for rotate/shear/translate
TIMM_OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
INCREASING = {"Posterize", "Solarize", "Color", "Contrast", "Brightness", "Sharpness"}  # "<name>Increasing" with inc1
_EXAMPLE = "use e.g. 'rand-m9-n2' or DeiT's 'rand-m9-mstd0.5-inc1'"


@dataclass(frozen=True)
class RandAugmentSpec:
    n: int = 2  # layers (ops per image)
    m: int = 10  # magnitude on timm's 0..10 scale
    p: float = 0.5  # probability that a chosen op is applied
    mstd: float = 0.0  # magnitude noise; inf: uniform in 0..m
    mmax: int = 0  # clip bound for the magnitude; 0 means timm's default, 10
    inc: bool = False  # timm's "increasing" op variants

    @property
    def upper(self) -> int:
        return self.mmax or LEVEL_DENOM  # timm: `magnitude_max or _LEVEL_DENOM`

    @property
    def num_bins(self) -> int:
        return self.upper * STEPS + 1

    def key(self) -> str:
        """Canonical string (for fingerprints): equal for specs that augment identically."""
        return f"rand-m{self.m}-n{self.n}-p{self.p}-mstd{self.mstd}-mmax{self.upper}-inc{int(self.inc)}"


def spec(value: str | Sequence[int] | None) -> RandAugmentSpec | None:
    """``None``/``""`` -> None; ``(n, m)`` or a timm string ``"rand-m9-n2..."`` -> RandAugmentSpec."""
    if value is None or value == "":
        return None
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(x, int) for x in value):
        value = f"rand-m{value[1]}-n{value[0]}"
    if not isinstance(value, str) or value.split("-")[0] != "rand":
        raise UserError(f"randaugment={value!r}: expected a timm RandAugment string starting with 'rand-'; {_EXAMPLE}")
    fields: dict = {}
    for part in value.split("-")[1:]:
        fields.update(_parse_part(value, part))
    s = RandAugmentSpec(**fields)
    if not 0 <= s.p <= 1:
        raise UserError(f"randaugment={value!r}: part 'p{s.p}' must be a probability in 0..1; {_EXAMPLE}")
    return s


def _parse_part(value: str, part: str) -> dict:
    bad = f"randaugment={value!r}: part {part!r}"
    if part.startswith("t") or part.startswith("w"):
        raise UserError(
            f"{bad}: weighted or named op sets ('t<name>', 'w<n>') are not supported with DALI; "
            f"drop the part; {_EXAMPLE}"
        )
    key_value = re.fullmatch(r"([a-z]+)(\d+(?:\.\d*)?)", part)
    if not key_value or key_value.group(1) not in ("m", "n", "p", "mstd", "mmax", "inc"):
        raise UserError(f"{bad} is not one of m<int>, n<int>, p<float>, mstd<float>, mmax<int>, inc<0|1>; {_EXAMPLE}")
    key, text = key_value.groups()
    try:
        if key == "p":
            return {"p": float(text)}
        if key == "mstd":
            mstd = float(text)
            return {"mstd": math.inf if mstd > 100 else mstd}  # timm: > 100 means uniform in 0..m
        number = int(text)
    except ValueError:
        raise UserError(f"{bad}: {key} takes an integer; {_EXAMPLE}") from None
    if key == "inc":
        if number not in (0, 1):
            raise UserError(f"{bad}: inc takes 0 or 1; {_EXAMPLE}")
        return {"inc": bool(number)}
    return {key: number}


def _levels(s: RandAugmentSpec) -> np.ndarray:
    """Magnitude of each bin on timm's scale: 0, 0.1, ..., upper."""
    return np.arange(s.num_bins, dtype=np.float64) / STEPS


class _Settings(TypedDict, total=False):
    """What ``Augmentation.augmentation`` may replace, typed as DALI's ``Augmentation.__init__`` declares it."""

    mag_range: np.ndarray
    randomly_negate: bool
    mag_to_param: Callable[[float], npt.ArrayLike] | None


def as_augmentation(made: _Decorated) -> Augmentation:
    """One of ``nvidia.dali.auto_aug.augmentations``' ops, typed as the Augmentation it is."""
    return cast("Augmentation", made)


def _variant(made: _Decorated, **settings: Unpack[_Settings]) -> Augmentation:
    """The op ``made`` with ``settings`` replaced (the others stay), as ``made.augmentation(**settings)``."""
    # DALI leaves Augmentation.augmentation's parameters unannotated with the class _UndefinedParam as
    # their default, which pyright takes for their type; they take what _Settings declares.
    return as_augmentation(made).augmentation(**settings)  # pyright: ignore[reportArgumentType]


def op_table(s: RandAugmentSpec) -> list[tuple[str, Augmentation]]:
    """timm's op list for ``s`` (timm names) with DALI augmentations whose magnitude bins are timm's."""
    from nvidia.dali.auto_aug import augmentations as a  # lazy: keeps DALI off a run's pre-flight data checks

    lv = _levels(s)
    frac = lv / LEVEL_DENOM

    def table(values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float32)

    posterize_bits = np.floor(frac * 4)
    solarize = np.minimum(256, np.floor(frac * 256))
    enhance: _Settings
    sharp: _Settings
    if s.inc:
        enhance = _Settings(mag_range=table(frac * 0.9), randomly_negate=True, mag_to_param=_increasing_factor)
        sharp = _Settings(enhance, mag_to_param=lambda mag: a.sharpness_kernel(_increasing_factor(mag) - 1))
        posterize_bits, solarize = 4 - posterize_bits, 256 - solarize
    else:
        enhance = _Settings(mag_range=table(frac * 1.8 + 0.1), randomly_negate=False, mag_to_param=None)
        sharp = _Settings(enhance, mag_to_param=a.sharpness_kernel_shifted)
    ops = {
        "AutoContrast": as_augmentation(a.auto_contrast),
        "Equalize": as_augmentation(a.equalize),
        "Invert": as_augmentation(a.invert),
        "Rotate": _variant(a.rotate, mag_range=table(frac * 30), randomly_negate=True),
        "Posterize": _variant(a.posterize, mag_range=table(posterize_bits), mag_to_param=_posterize_mask),
        "Solarize": _variant(a.solarize, mag_range=table(solarize)),
        "SolarizeAdd": _variant(
            a.solarize_add, mag_range=table(np.minimum(128, np.floor(frac * 110))), mag_to_param=_solarize_add
        ),
        "Color": _variant(a.color, **enhance),
        "Contrast": _variant(a.contrast, **enhance),
        "Brightness": _variant(a.brightness, **enhance),
        "Sharpness": _variant(a.sharpness, **sharp),
        "ShearX": _variant(a.shear_x, mag_range=table(frac * 0.3), randomly_negate=True),
        "ShearY": _variant(a.shear_y, mag_range=table(frac * 0.3), randomly_negate=True),
        "TranslateXRel": _variant(a.translate_x, mag_range=table(frac * 0.45), randomly_negate=True),
        "TranslateYRel": _variant(a.translate_y, mag_range=table(frac * 0.45), randomly_negate=True),
    }
    return [(name + ("Increasing" if s.inc and name in INCREASING else ""), ops[name]) for name in TIMM_OPS]


def _increasing_factor(mag: float) -> np.float32:
    return np.float32(max(0.1, 1.0 + float(mag)))  # timm: max(0.1, 1 +- level * 0.9)


def _posterize_mask(bits: float) -> np.uint8:
    keep = int(min(8, max(0, round(float(bits)))))  # PIL's posterize keeps `bits` high bits (0: black)
    return np.uint8(0xFF ^ ((1 << (8 - keep)) - 1))


def _solarize_add(add: float) -> np.uint8:
    return np.uint8(round(float(add)))


def magnitude_bins(s: RandAugmentSpec) -> int | DataNode:
    """The magnitude bin of each layer: an int, or with ``mstd`` a per-sample INT32 DataNode of shape (n,)."""
    if s.mstd == 0 or s.m == 0 and math.isinf(s.mstd):
        return round(min(s.m, s.upper) * STEPS)
    import nvidia.dali.fn as fn  # lazy: keeps DALI off a run's pre-flight data checks
    import nvidia.dali.math as dmath  # lazy: keeps DALI off a run's pre-flight data checks
    import nvidia.dali.types as types  # lazy: keeps DALI off a run's pre-flight data checks

    if math.isinf(s.mstd):
        mag = fn.random.uniform(range=[0.0, float(s.m)], shape=(s.n,))
    else:
        mag = fn.random.normal(mean=float(s.m), stddev=float(s.mstd), shape=(s.n,))
    # Clip to 0..upper as timm does; DALI's cast to int rounds to the nearest bin.
    return fn.cast(dmath.clamp(mag * float(STEPS), 0.0, float(s.upper * STEPS)), dtype=types.DALIDataType.INT32)


def apply(images: DataNode, s: RandAugmentSpec, shape: Sequence[int]) -> DataNode:
    """RandAugment ``images`` (uint8 HWC, all of size ``shape`` = [H, W]) as timm would.

    Per sample and layer: an op index uniform over ``op_table(s)``, a coin with probability
    ``s.p`` that decides whether it runs (else identity), a magnitude bin and a random sign for
    the signed ops. Must be called inside a pipeline built with ``enable_conditionals=True``.
    """
    if s.n == 0:
        return images
    import nvidia.dali.fn as fn  # lazy: keeps DALI off a run's pre-flight data checks
    import nvidia.dali.types as types  # lazy: keeps DALI off a run's pre-flight data checks
    from nvidia.dali.auto_aug import augmentations as a  # lazy: keeps DALI off a run's pre-flight data checks
    from nvidia.dali.auto_aug.core import select, signed_bin  # lazy: keeps DALI off a run's pre-flight data checks

    ops = [aug for _, aug in op_table(s)] + [as_augmentation(a.identity)]
    k = len(ops) - 1
    op = fn.random.uniform(values=list(range(k)), shape=(s.n,), dtype=types.DALIDataType.INT32)
    run = fn.cast(fn.random.coin_flip(probability=s.p, shape=(s.n,)), dtype=types.DALIDataType.INT32)
    choice = op * run + k * (1 - run)  # k: the identity
    bins = signed_bin(magnitude_bins(s), shape=(s.n,))
    for layer in range(s.n):
        images = select(
            ops,
            choice[layer],
            images,
            magnitude_bin=bins[layer],
            num_magnitude_bins=s.num_bins,
            shape=shape,
            fill_value=FILL,
        )
    return images
