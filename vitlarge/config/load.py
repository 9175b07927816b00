"""Loading a recipe, dotted ``key=value`` overrides and validation, all before the world size is known.

``load_config(path, overrides)`` runs the recipe, applies the overrides (type-checked; unknown keys
rejected with the closest match) and validates the result: one line naming the key and a valid
setting for each bad value. ``vitlarge.plan.plan.make_plan`` then derives the step counts for a
world size. This module imports nothing from torch, so recipes load fast and ``--dry-run`` touches no data.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import sys
import types
import typing
from pathlib import Path
from typing import Literal

from vitlarge.config.schema import Config
from vitlarge.errors import UserError


def _fields(obj) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(obj)}


def all_keys(cfg: Config) -> list[str]:
    keys = []
    for name in _fields(cfg):
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            keys += [f"{name}.{sub}" for sub in _fields(value)]
        else:
            keys.append(name)
    return keys


def _unknown_key(key: str, cfg: Config, origin: str) -> UserError:
    close = difflib.get_close_matches(key, all_keys(cfg), n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'?" if close else "see vitlarge/config/load.py for the keys"
    return UserError(f"{origin}: unknown config key '{key}'; {hint}")


def _parse_value(text: str, typ, key: str, origin: str):
    """Turns override text into the declared type of ``key``; ``None``/``none`` where Optional."""
    origin_t = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin_t in (typing.Union, types.UnionType) and type(None) in args:
        if text.lower() in ("none", "null"):
            return None
        typ = next(a for a in args if a is not type(None))
    try:
        if typ is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ is int:
            return int(float(text)) if float(text).is_integer() else int(text)
        if typ is float:
            return float(text)
        if typ is tuple:
            return tuple(float(x) for x in text.strip("()[] ").split(",") if x.strip())
        if typ in (dict, list):
            import ast

            value = ast.literal_eval(text)
            if not isinstance(value, typ):
                raise ValueError
            return value
        return text
    except ValueError:
        raise UserError(
            f"{origin}: '{key}={text}' is not a valid {getattr(typ, '__name__', typ)}; "
            f"give a {getattr(typ, '__name__', typ)} value"
        ) from None


def apply_override(cfg: Config, item: str, origin: str = "command line") -> None:
    """Applies one ``dotted.key=value`` override in place."""
    if "=" not in item:
        raise UserError(f"{origin}: override '{item}' has no '='; write it as key=value, e.g. optim.lr=0.01")
    key, text = item.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    target = cfg
    for part in parts[:-1]:
        if not dataclasses.is_dataclass(target) or part not in _fields(target):
            raise _unknown_key(key, cfg, origin)
        target = getattr(target, part)
    if not dataclasses.is_dataclass(target) or parts[-1] not in _fields(target):
        raise _unknown_key(key, cfg, origin)
    if dataclasses.is_dataclass(getattr(target, parts[-1])):
        raise UserError(
            f"{origin}: '{key}' is a section; set one of its fields, e.g. {key}.{next(iter(_fields(getattr(target, parts[-1]))))}=..."
        )
    hints = typing.get_type_hints(type(target))
    setattr(target, parts[-1], _parse_value(text.strip(), hints[parts[-1]], key, origin))


def _check_types(cfg: Config, origin: str) -> None:
    """Rejects values of the wrong type that a recipe assigned directly."""
    for section_name, section in [(n, getattr(cfg, n)) for n in _fields(cfg)]:
        if not dataclasses.is_dataclass(section):
            continue
        hints = typing.get_type_hints(type(section))
        for name in _fields(section):
            key, value, typ = f"{section_name}.{name}", getattr(section, name), hints[name]
            args = typing.get_args(typ)
            if typing.get_origin(typ) is Literal:  # allowed values are declared with the field
                if value not in args:
                    raise UserError(f"{origin}: '{key}' is '{value}'; choose one of {', '.join(args)}")
                continue
            if typing.get_origin(typ) in (typing.Union, types.UnionType):  # Optional[X] or X | None
                if value is None and type(None) in args:
                    continue
                typ = next(a for a in args if a is not type(None))
            ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
            if typ is float and isinstance(value, int) and not isinstance(value, bool):
                setattr(section, name, float(value))
                ok = True
            if typ is tuple and isinstance(value, list):
                setattr(section, name, tuple(value))
                ok = True
            if typ is list and isinstance(value, tuple):
                setattr(section, name, list(value))
                ok = True
            if not ok:
                raise UserError(
                    f"{origin}: '{key}' must be a {typ.__name__}, got {value!r}; fix the recipe or override"
                )


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


# Every duration, count and rate: (keys, test, the rule in words). Counts and durations name their
# unit (``_steps``, ``_epochs``); where 0 has a meaning, the rule says it.
RANGES = [
    (
        (
            "train.global_batch",
            "train.micro_batch",
            "train.keep_checkpoints",
            "train.log_every_steps",
            "train.nan_patience",
            "train.loss_scale_growth_interval",
            "data.image_size",
            "data.num_classes",
            "data.num_train_examples",
            "data.synthetic_val_examples",
            "data.repeats",
        ),
        lambda v: v >= 1,
        "positive",
    ),
    (("data.num_threads",), lambda v: v >= 0, ">= 0 (0: the process's CPU share from its launcher)"),
    (("train.epochs", "optim.lr", "optim.eps", "train.init_loss_scale"), lambda v: v > 0, "positive"),
    (("train.checkpoint_every_steps",), lambda v: v >= 0, ">= 0 (0: no periodic checkpoints)"),
    (("train.max_steps",), lambda v: v >= 0, ">= 0 (0: the whole schedule)"),
    (("train.eval_every_epochs",), lambda v: v >= 0, ">= 0 (0: only the final evaluation)"),
    (
        ("schedule.warmup_epochs", "optim.weight_decay", "augment.mixup_alpha", "augment.cutmix_alpha"),
        lambda v: v >= 0,
        ">= 0",
    ),
    (("optim.clip_grad_norm",), lambda v: v >= 0, ">= 0 (0: no clipping)"),
    (("data.color_jitter",), lambda v: v >= 0, ">= 0 (0: off; DeiT III uses 0.3)"),
    (("data.src_padding",), lambda v: v >= 0, ">= 0 (DeiT III pads by 4)"),
    (("data.read_workers",), lambda v: v >= 0, ">= 0 (0: the training process reads the records)"),
    (("train.seed",), lambda v: 0 <= v < 2**31, "in [0, 2**31)"),
    (("schedule.min_lr_ratio", "augment.mixup_prob", "augment.random_erase_prob"), lambda v: 0 <= v <= 1, "in [0, 1]"),
    (("optim.layer_decay",), lambda v: 0 < v <= 1, "in (0, 1] (1.0: no layer-wise lr decay)"),
    (("train.ema_decay",), lambda v: 0 <= v < 1, "in [0, 1) (0: no model EMA; timm uses 0.9998)"),
    (
        (
            "augment.label_smoothing",
            "model.pos_drop_rate",
            "model.attn_drop_rate",
            "model.proj_drop_rate",
            "model.head_drop_rate",
            "model.drop_path_rate",
        ),
        lambda v: 0 <= v < 1,
        "in [0, 1)",
    ),
]


PAIRS = {
    "optim.betas": (lambda a, b: 0 <= a < 1 and 0 <= b < 1, "two numbers in [0, 1)"),
    "data.crop_scale": (lambda lo, hi: 0 < lo <= hi <= 1, "(low, high) with 0 < low <= high <= 1"),
    "data.crop_ratio": (lambda lo, hi: 0 < lo <= hi, "(low, high) with 0 < low <= high"),
}


def _get(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _check_ranges(cfg: Config, origin: str) -> None:
    """One line per bad value: the key, the rule, the value, and a valid setting (the schema's default)."""
    for keys, ok, rule in RANGES:
        for key in keys:
            value = _get(cfg, key)
            if not (_finite(value) and ok(value)):
                raise UserError(
                    f"{origin}: '{key}' must be {rule}, got {value}; set it like {key}={_get(Config(), key)}"
                )
    for key, (ok, rule) in PAIRS.items():
        value = _get(cfg, key)
        if not (len(value) == 2 and all(map(_finite, value)) and ok(*value)):
            example = ",".join(f"{x:g}" for x in _get(Config(), key))
            raise UserError(f"{origin}: '{key}' must be {rule}, got {value}; set it like {key}={example}")


def validate(cfg: Config, origin: str = "config") -> None:
    """Checks everything that can be checked before the world size is known."""
    if cfg.train.plugin == "zero":  # removed: it needed CUDA, no test ran it, and it was broken
        raise UserError(
            f"{origin}: train.plugin=zero was removed; use train.plugin=fsdp (sharded weights, "
            "gradients and optimizer states; CPU and CUDA)"
        )
    _check_types(cfg, origin)  # also the allowed values of the Literal fields
    _check_ranges(cfg, origin)
    t = cfg.train
    if t.global_batch % t.micro_batch:
        raise UserError(
            f"{origin}: train.global_batch={t.global_batch} is not a multiple of train.micro_batch={t.micro_batch}; "
            "change one of them"
        )
    thresh = cfg.augment.bce_target_thresh
    if thresh is not None and not (_finite(thresh) and 0 <= thresh < 1):
        raise UserError(
            f"{origin}: 'augment.bce_target_thresh' must be in [0, 1) or None, got {thresh}; "
            "set it like augment.bce_target_thresh=0.0 (DeiT III) or augment.bce_target_thresh=none"
        )
    if thresh is not None and cfg.augment.loss != "bce":
        raise UserError(
            f"{origin}: augment.bce_target_thresh={thresh} applies to augment.loss=bce only, got "
            f"augment.loss={cfg.augment.loss}; set augment.loss=bce or augment.bce_target_thresh=none"
        )
    smoothed_off = cfg.augment.label_smoothing / cfg.data.num_classes  # the value smoothing gives every other class
    if thresh is not None and cfg.augment.loss == "bce" and thresh < smoothed_off:
        raise UserError(
            f"{origin}: augment.bce_target_thresh={thresh} is below what augment.label_smoothing="
            f"{cfg.augment.label_smoothing} gives every class ({smoothed_off:.3g}), so every target would be 1; "
            "set augment.label_smoothing=0 (DeiT III) or a threshold above it (timm users pair 0.1 with 0.2)"
        )
    if cfg.augment.mixup_alpha > 0 or cfg.augment.cutmix_alpha > 0:
        if t.micro_batch % 2:
            raise UserError(
                f"{origin}: Mixup/CutMix need an even train.micro_batch, got {t.micro_batch}; "
                "use an even micro batch or set augment.mixup_alpha=0 augment.cutmix_alpha=0"
            )
    if cfg.data.crop == "src" and cfg.data.src_padding >= cfg.data.image_size:
        raise UserError(
            f"{origin}: data.src_padding={cfg.data.src_padding} is not below data.image_size={cfg.data.image_size} "
            "(reflect padding needs more pixels than it pads); set data.src_padding=4 (DeiT III) or less"
        )
    if cfg.data.three_augment and cfg.data.randaugment:  # DeiT III uses one or the other
        raise UserError(
            f"{origin}: data.three_augment=true and data.randaugment={cfg.data.randaugment!r} are both set; "
            "DeiT III uses one or the other: set data.randaugment=none or data.three_augment=false"
        )
    if not (0 < cfg.data.val_crop_pct <= 1):
        raise UserError(
            f"{origin}: data.val_crop_pct must be in (0, 1], got {cfg.data.val_crop_pct}; "
            "set it like data.val_crop_pct=0.875"
        )
    if (t.export_ema or t.ema_warmup) and t.ema_decay == 0:
        key = "train.export_ema" if t.export_ema else "train.ema_warmup"
        raise UserError(
            f"{origin}: {key}=true needs a model EMA, but train.ema_decay=0 (off); "
            f"set train.ema_decay (e.g. train.ema_decay=0.9998) or {key}=false"
        )
    if cfg.schedule.warmup_epochs > t.epochs:
        raise UserError(
            f"{origin}: schedule.warmup_epochs={cfg.schedule.warmup_epochs} exceeds train.epochs={t.epochs}; "
            "lower the warmup or raise train.epochs"
        )
    if t.phases:
        from vitlarge.config.phase_list import check

        check(cfg, origin)


def load_recipe(path: str | Path) -> Config:
    """Runs a recipe file and returns its ``config()``; errors name the file."""
    path = Path(path)
    if not path.is_file() and path.suffix == "" and len(path.parts) == 1:  # a shipped recipe's name: vit_b16
        from vitlarge import beside

        path = Path(beside("recipes").__file__).parent / f"{path}.py"
    if not path.is_file():
        raise UserError(f"recipe {path} does not exist; pass --config recipes/<name>.py (or a recipe's name)")
    root, package = path.resolve().parent, []
    while (root / "__init__.py").is_file():  # recipes/ (vitlarge.recipes installed): relative imports of a base
        package.insert(0, root.name)
        root = root.parent
    if not package:  # a recipe of one's own, in the checkout's tree: it imports its base as recipes.<name>
        root = path.resolve().parent.parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if package:
        importlib.import_module(".".join(package))
    name = ".".join([*package, path.stem]) if package else f"_vitlarge_recipe_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"recipe {path} failed to load: {type(e).__name__}: {e}") from None
    if not callable(getattr(module, "config", None)):
        raise UserError(f"recipe {path} defines no config() function; add 'def config() -> Config'")
    try:
        cfg = module.config()
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"recipe {path}: config() raised {type(e).__name__}: {e}") from None
    if not isinstance(cfg, Config):
        raise UserError(f"recipe {path}: config() returned {type(cfg).__name__}, not vitlarge.config.schema.Config")
    return cfg


def load_config(path: str | Path, overrides: list[str] = (), **direct: str | None) -> Config:
    """Recipe + direct settings (``data.path``, ``workdir``) + dotted overrides, validated."""
    cfg = load_recipe(path)
    for key, value in direct.items():
        if value is not None:
            apply_override(cfg, f"{key.replace('__', '.')}={value}")
    for item in overrides:
        apply_override(cfg, item)
    validate(cfg, origin=str(path))
    return cfg
