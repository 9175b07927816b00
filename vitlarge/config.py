"""The one config schema every part of vitlarge reads, and the plan derived from it.

A recipe is a Python file that defines ``config() -> Config``; derived recipes call their base and
change a few fields. ``load_config(path, overrides)`` runs the recipe, applies dotted ``key=value``
overrides (type-checked; unknown keys rejected with the closest match) and validates the result.
``make_plan(cfg, world_size, num_train_examples)`` derives the step counts once; everything else
receives the plan and never recomputes it.

Units are in the names (``warmup_epochs``, ``checkpoint_every_steps``); inside the trainer every
duration is an optimizer step. This module imports nothing from torch, so recipes load fast and
``--dry-run`` touches no data.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vitlarge.errors import UserError

IMAGENET_TRAIN_EXAMPLES = 1_281_167
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class ModelConfig:
    name: str = "vit_base_patch16_224"
    """timm model name; the classifier gets ``data.num_classes`` outputs."""
    pos_drop_rate: float = 0.0
    """Dropout after adding position embeddings (timm ``pos_drop_rate``)."""
    attn_drop_rate: float = 0.0
    """Dropout on attention probabilities (timm ``attn_drop_rate``)."""
    proj_drop_rate: float = 0.0
    """Dropout after the attention projection and in the MLP (timm ``proj_drop_rate``)."""
    head_drop_rate: float = 0.0
    """Dropout before the classifier; timm 1.x calls this ``drop_rate``."""
    drop_path_rate: float = 0.0
    """Stochastic depth."""
    grad_checkpointing: bool = False
    """Recompute block activations in backward (timm ``set_grad_checkpointing``): less memory, ~30% more compute."""
    fused_attn: Literal["auto", "on", "off"] = "auto"
    """``on``/``off``/``auto`` for scaled-dot-product attention; ``auto`` turns it off only for fp16 on CPU,
    where PyTorch 2.5's fused attention backward is ~5x slower than the unfused one (measured)."""
    kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments for ``timm.create_model`` (e.g. ``patch_size``, ``embed_dim``, ``depth``)."""
    init_from: str = ""
    """Start from these weights (fine-tuning): an export folder or its ``model.safetensors``, a
    ``checkpoints/step_*`` folder, or a timm checkpoint file. Weights only; the position embedding is
    resampled to ``data.image_size`` and a classifier of another class count re-initialised
    (`vitlarge.init_from`). A resumed run takes its checkpoint's weights instead."""


@dataclass
class DataConfig:
    source: Literal["tfrecord", "synthetic"] = "tfrecord"
    """``tfrecord``: DALI over the shards in ``data.path``. ``synthetic``: random images and labels made on the
    device (`vitlarge.data.synthetic`: no files, no DALI, ``data.path`` unused), for throughput checks and
    runs on a machine without the data set: ``data.num_train_examples`` per epoch, a fixed validation set of
    ``data.synthetic_val_examples``, ``data.num_classes`` classes named ``class_0000``...; the crop, flip and
    RandAugment settings do not apply (Mixup/CutMix and label smoothing do). See docs/DATA.md."""
    path: str = ""
    """Directory of TFRecord shards with ``dataset.json`` (``--data`` sets it)."""
    num_classes: int = 1000
    """Classes of the data set; must match ``dataset.json`` (the classifier has this many outputs)."""
    num_train_examples: int = IMAGENET_TRAIN_EXAMPLES
    """Examples per epoch for ``--dry-run`` and for ``data.source=synthetic`` (ImageNet-1k's train split by
    default, so the recipes' step counts are ImageNet's); a tfrecord run takes the count from ``dataset.json``."""
    synthetic_val_examples: int = 512
    """Size of the fixed validation set of ``data.source=synthetic`` (the same images at any world size)."""
    image_size: int = 224
    """Side in pixels of the square training and validation images."""
    num_threads: int = 0
    """DALI worker threads per process; 0: the process's CPU share from its launcher
    (``vitlarge.launch.dali_threads``: affinity mask / tasks on the node, Slurm's binding and
    ``--cpus-per-task``; not torchrun's blanket ``OMP_NUM_THREADS=1``). A recipe's value wins."""
    crop_scale: tuple = (0.08, 1.0)
    """Area fraction range of the random-resized crop."""
    crop_ratio: tuple = (3 / 4, 4 / 3)
    """Aspect ratio range (width / height) of the random-resized crop."""
    hflip: bool = True
    """Random horizontal flips in training."""
    randaugment: str | None = None
    """timm's RandAugment string with timm's meaning, run in DALI: ``"rand-m9-n2"``, DeiT's
    ``"rand-m9-mstd0.5-inc1"`` (parts m, n, p, mstd, mmax, inc; see docs/DATA.md); None disables it."""
    val_crop_pct: float = 0.875
    """Validation resizes the shorter side to ``image_size / val_crop_pct``, then centre-crops."""
    mean: tuple = IMAGENET_MEAN
    """Per-channel RGB mean subtracted from the pixels, in timm's 0..1 convention (ImageNet's)."""
    std: tuple = IMAGENET_STD
    """Per-channel RGB standard deviation the pixels are divided by, 0..1 convention (ImageNet's)."""
    label_offset: int | None = None
    """Subtracted from stored labels; None takes it from ``dataset.json`` (1 for TF-made shards)."""


@dataclass
class AugmentConfig:
    mixup_alpha: float = 0.0
    """Mixup Beta(alpha, alpha) parameter (timm ``Mixup``); 0 disables Mixup. Needs an even micro batch."""
    cutmix_alpha: float = 0.0
    """CutMix Beta parameter; 0 disables CutMix. With both on, timm switches between them per batch."""
    mixup_prob: float = 1.0
    """Probability that Mixup/CutMix is applied to a batch."""
    label_smoothing: float = 0.0
    """Label smoothing of the targets (folded into the soft targets under Mixup/CutMix)."""


@dataclass
class OptimConfig:
    name: Literal["lamb", "adamw"] = "lamb"
    """``lamb`` (vitlarge's multi-tensor LAMB) or ``adamw``."""
    lr: float = 1.8e-2
    """Peak learning rate, reached at the end of warmup."""
    weight_decay: float = 0.1
    """Applied to matrices only; biases, norms, pos-embed and cls token get none (and no trust ratio)."""
    betas: tuple = (0.9, 0.999)
    """Adam/LAMB moment decay rates (beta1, beta2)."""
    eps: float = 1e-6
    """Added to the second moment's square root for stability."""
    bias_correction: bool = True
    """LAMB's Adam-style bias correction of the moments (vitlarge's LAMB; AdamW always corrects)."""
    clip_grad_norm: float = 1.0
    """Global L2 norm, applied after fp16 unscaling; 0 disables clipping (the norm is still logged)."""


@dataclass
class ScheduleConfig:
    warmup_epochs: float = 0.0
    """Linear warmup from 0 to ``optim.lr``, in epochs; converted once to optimizer steps."""
    decay: Literal["linear", "cosine", "constant"] = "linear"
    """``linear``, ``cosine`` or ``constant`` after warmup."""
    min_lr_ratio: float = 0.0
    """Final lr as a fraction of the peak."""


@dataclass
class TrainConfig:
    global_batch: int = 32768
    """Images per optimizer step over all devices; fixed by the recipe, whatever the world size."""
    micro_batch: int = 256
    """Images per device per forward/backward; accumulation = global / (micro x world)."""
    epochs: float = 300
    """Length of the schedule in epochs; converted once to optimizer steps."""
    precision: Literal["fp16", "bf16", "fp32", "auto"] = "fp16"
    """``fp16`` (autocast + dynamic loss scaling), ``bf16`` (autocast), ``fp32``, or ``auto``: the fastest
    the device trains in, resolved at start (`vitlarge.precision.resolve`): bf16 on GPUs with bf16
    tensor cores, else fp16; on CPUs fp16/bf16 only with fast units for them, else fp32."""
    init_loss_scale: float = 2.0**16
    """Initial fp16 loss scale (dynamic: halved on overflow, doubled after ``loss_scale_growth_interval``)."""
    loss_scale_growth_interval: int = 2000
    """Optimizer steps without overflow after which the fp16 loss scale doubles."""
    compile: Literal["auto", "on", "off"] = "auto"
    """``on``: the model's forward (and so its backward) runs through ``torch.compile`` (`nn.Module.compile`
    before the Booster: parameter names, checkpoints and exports unchanged; static shapes, one graph per
    input shape and train/eval, the recompile limit sized to the phases: `vitlarge.build.compile_model`).
    ``auto``: on with CUDA, off on CPU, where it measured slower (0.8x) and costs minutes of compiling
    (docs/PERFORMANCE.md); resolved at start and logged (`vitlarge.build.resolve_compile`)."""
    plugin: Literal["ddp", "fsdp"] = "ddp"
    """Colossal-AI Booster plugin: ``ddp`` (TorchDDPPlugin: replicas) or ``fsdp`` (`vitlarge.fsdp`: weights,
    gradients and LAMB states sharded over the ranks by FSDP2, one group per transformer block; CPU and CUDA)."""
    fsdp_accumulation: Literal["auto", "no_sync", "reduce_scatter"] = "auto"
    """``fsdp`` with gradient accumulation: ``no_sync`` keeps full unsharded gradients between micro-steps
    and reduce-scatters once per optimizer step (least traffic, +1 unsharded fp32 gradient of memory per rank;
    FSDP2 accumulates it in fp32 under bf16/fp16 too); ``reduce_scatter`` reduce-scatters
    every micro-step into this rank's fp32 shard (least memory, ``accum_steps`` x the gradient traffic);
    ``auto``: reduce_scatter under bf16/fp16, no_sync under fp32. See docs/FSDP.md."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """``auto`` (cuda when available), ``cuda`` or ``cpu``."""
    seed: int = 42
    """Initial weights (same on every rank); data order and augmentation use it with the rank."""
    log_every_steps: int = 10
    """A console progress line every this many optimizer steps (metrics.jsonl has every step)."""
    eval_every_epochs: float = 10
    """Evaluate every this many epochs (rounded to steps, at least 1); 0: only the final evaluation."""
    checkpoint_every_steps: int = 500
    """0: never periodically; a checkpoint is still written at the end and on SIGTERM/SIGUSR1."""
    keep_checkpoints: int = 3
    """Newest checkpoints kept (at least 1); older ones are deleted after each save."""
    nan_patience: int = 5
    """Stop when the loss is non-finite this many optimizer steps in a row."""
    max_steps: int = 0
    """Stop after this many optimizer steps (0: run the whole schedule). The schedule still spans all epochs."""
    phases: list = field(default_factory=list)
    """Progressive resolution: phases with their own image size, batch, crop scale and lr, as dicts
    (``[{"epoch": 0, "image_size": 128}, {"epoch": 80, "image_size": 224}]``); [] trains one phase
    from the fields above. Keys and rules: `vitlarge.phases`."""


@dataclass
class Config:
    """A whole run. Recipes build one; ``--set`` style overrides edit it by dotted key."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """What to train: the timm model and its dropouts."""
    data: DataConfig = field(default_factory=DataConfig)
    """The data set (TFRecord shards, or synthetic) and its input pipeline."""
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    """Batch-level augmentation: Mixup, CutMix, label smoothing."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and gradient clipping."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Learning-rate schedule: warmup, then decay."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Batch sizes, length, precision, plugin and the run cadence."""
    workdir: str = "runs/default"
    """Logs, metrics, checkpoints and the exported model go here; a rerun resumes from it."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Plan:
    """Step counts derived once from the config, the world size and the data set size."""

    world_size: int
    global_batch: int
    micro_batch: int
    accum_steps: int
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    eval_every_steps: int
    num_train_examples: int
    phases: tuple = ()
    """`vitlarge.phases.Phase` per phase (empty without ``train.phases``); the fields above are the first phase's."""

    def describe(self) -> str:
        return (
            f"global batch {self.global_batch} = {self.micro_batch} (micro) x {self.accum_steps} "
            f"(accumulation) x {self.world_size} (devices); {self.steps_per_epoch} steps/epoch, "
            f"{self.total_steps} steps, {self.warmup_steps} warmup steps"
        )


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
    hint = f"did you mean '{close[0]}'?" if close else "see vitlarge/config.py for the keys"
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
    (("train.seed",), lambda v: 0 <= v < 2**31, "in [0, 2**31)"),
    (("schedule.min_lr_ratio", "augment.mixup_prob"), lambda v: 0 <= v <= 1, "in [0, 1]"),
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
    if cfg.train.plugin == "zero":  # removed (issue 12): it needed CUDA, no test ran it, and it was broken
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
    if cfg.augment.mixup_alpha > 0 or cfg.augment.cutmix_alpha > 0:
        if t.micro_batch % 2:
            raise UserError(
                f"{origin}: Mixup/CutMix need an even train.micro_batch, got {t.micro_batch}; "
                "use an even micro batch or set augment.mixup_alpha=0 augment.cutmix_alpha=0"
            )
    if not (0 < cfg.data.val_crop_pct <= 1):
        raise UserError(
            f"{origin}: data.val_crop_pct must be in (0, 1], got {cfg.data.val_crop_pct}; "
            "set it like data.val_crop_pct=0.875"
        )
    if cfg.schedule.warmup_epochs > t.epochs:
        raise UserError(
            f"{origin}: schedule.warmup_epochs={cfg.schedule.warmup_epochs} exceeds train.epochs={t.epochs}; "
            "lower the warmup or raise train.epochs"
        )
    if t.phases:
        from vitlarge.phases import check

        check(cfg, origin)


def make_plan(cfg: Config, world_size: int, num_train_examples: int | None = None) -> Plan:
    """Derives accumulation and step counts; raises UserError when the batch does not divide."""
    t = cfg.train
    n = num_train_examples or cfg.data.num_train_examples
    if t.phases:  # each phase derives and checks its own micro batch (vitlarge.phases.plan_phases)
        return _phased_plan(cfg, world_size, n)
    per_step = t.micro_batch * world_size
    if t.global_batch % per_step:
        raise UserError(
            f"train.global_batch={t.global_batch} is not divisible by train.micro_batch x world size = "
            f"{t.micro_batch} x {world_size} = {per_step}; pick a micro_batch or device count that divides it"
        )
    # Drop the last partial global batch of each epoch, as the original did: every optimizer step
    # sees exactly global_batch images, so the lr schedule means the same at any world size.
    steps_per_epoch = n // t.global_batch
    if steps_per_epoch == 0:
        raise UserError(
            f"train.global_batch={t.global_batch} is larger than the {n} training images; lower train.global_batch"
        )
    total = max(1, epochs_to_steps(t.epochs, steps_per_epoch))
    return Plan(
        world_size=world_size,
        global_batch=t.global_batch,
        micro_batch=t.micro_batch,
        accum_steps=t.global_batch // per_step,
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        warmup_steps=epochs_to_steps(cfg.schedule.warmup_epochs, steps_per_epoch),
        eval_every_steps=max(1, epochs_to_steps(t.eval_every_epochs, steps_per_epoch))
        if t.eval_every_epochs > 0
        else 0,
        num_train_examples=n,
    )


def _phased_plan(cfg: Config, world_size: int, n: int) -> Plan:
    """A plan whose per-phase batches and steps come from `vitlarge.phases`; its scalar fields are the first phase's."""
    from vitlarge.phases import plan_phases, step_at_epoch

    phases = plan_phases(cfg, world_size, n)
    first, t = phases[0], cfg.train
    eval_every = max(1, epochs_to_steps(t.eval_every_epochs, first.steps_per_epoch)) if t.eval_every_epochs > 0 else 0
    return Plan(
        world_size=world_size,
        global_batch=first.global_batch,
        micro_batch=first.micro_batch,
        accum_steps=first.accum_steps,
        steps_per_epoch=first.steps_per_epoch,
        total_steps=max(1, phases[-1].end_step),
        warmup_steps=step_at_epoch(phases, cfg.schedule.warmup_epochs),
        eval_every_steps=eval_every,
        num_train_examples=n,
        phases=phases,
    )


def load_recipe(path: str | Path) -> Config:
    """Runs a recipe file and returns its ``config()``; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"recipe {path} does not exist; pass --config recipes/<name>.py")
    root = str(path.resolve().parent.parent)
    if root not in sys.path:  # lets derived recipes import their base as recipes.<name>
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location(f"_vitlarge_recipe_{path.stem}", path)
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
        raise UserError(f"recipe {path}: config() returned {type(cfg).__name__}, not vitlarge.config.Config")
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


def epochs_to_steps(epochs: float, steps_per_epoch: int) -> int:
    """The one conversion from an epoch count to optimizer steps."""
    return int(math.floor(epochs * steps_per_epoch + 0.5))
