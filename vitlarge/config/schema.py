"""The one config schema every part of vitlarge reads: a dataclass per section, with units in the names.

A recipe is a Python file that defines ``config() -> Config``; derived recipes call their base and
change a few fields (vitlarge/config/load.py runs it, applies overrides and validates). Units are in
the names (``warmup_epochs``, ``checkpoint_every_steps``); inside the trainer every duration is an
optimizer step. Nothing here imports torch, so recipes load fast and ``--dry-run`` touches no data.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from vitlarge.constants import IMAGENET_MEAN, IMAGENET_STD, IMAGENET_TRAIN_EXAMPLES
from vitlarge.errors import UserError


@dataclass(frozen=True)
class Rule:
    """The values a number field allows (with ``items`` over 1: a tuple of that many numbers, ``test`` taking them
    all): ``test``, and the rule in words for the one line `check_ranges` prints with the key, the value and the
    default. A field declares its rule with `ruled`, beside its type and default."""

    test: Callable[..., bool]
    words: str
    items: int = 1


def ruled(default, rule: Rule):
    """A field's default and its `Rule` (kept in the field's metadata)."""
    return field(default=default, metadata={"rule": rule})


def rule_of(f: dataclasses.Field) -> Rule | None:
    return f.metadata.get("rule")


@dataclass(frozen=True)
class Problem:
    """A rule that several fields break together: ``text`` says which and how to fix it; ``keys`` are the fields
    (the first of them an override set is whom `vitlarge.config.checks.validate`'s line blames)."""

    keys: tuple[str, ...]
    text: str


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


# Rules many fields share. Counts and durations name their unit (``_steps``, ``_epochs``); where 0 has a
# meaning, the field's own rule says it.
COUNT = Rule(lambda v: v >= 1, "positive")
POSITIVE = Rule(lambda v: v > 0, "positive")
NON_NEGATIVE = Rule(lambda v: v >= 0, ">= 0")
FRACTION = Rule(lambda v: 0 <= v <= 1, "in [0, 1]")
PROBABILITY = Rule(lambda v: 0 <= v < 1, "in [0, 1)")
MAX_EPOCHS = 10**6
"""The most epochs a duration may name: far past any schedule, and step counts stay numbers (1e308 epochs made
the plan's conversion to steps overflow)."""
EPOCHS = Rule(lambda v: 0 < v <= MAX_EPOCHS, f"positive and at most {MAX_EPOCHS:,}")
CROP_SCALE = Rule(lambda lo, hi: 0 < lo <= hi <= 1, "(low, high) with 0 < low <= high <= 1", items=2)
"""``data.crop_scale``'s rule, and a phase's ``crop_scale`` (`vitlarge.config.phase_list`)."""
MAX_IMAGE_SIZE = 1024
"""The largest image side, in pixels, that a recipe, a phase or a file from elsewhere (a checkpoint's meta.json, an
export's config.json) may state: above every ImageNet ViT (timm's largest take 448-518 px, a FixRes evaluation
1.5x its training size), while one evaluation batch at 4,096 px took more than 7 GiB. Checked before any model or
pipeline is built at the size."""
IMAGE_SIZE = Rule(lambda v: 1 <= v <= MAX_IMAGE_SIZE, f"positive and at most {MAX_IMAGE_SIZE:,}")
"""``data.image_size``'s rule, and a phase's ``image_size`` and ``eval_size`` (`vitlarge.config.phase_list`): a
phase may evaluate at any size within it (progressive training at 96 px evaluates at 224 px)."""
MAX_EVAL_TOKENS = 4096
"""The most patches an export's evaluation may ask of its model (``(input_size / patch)**2`` of its config.json,
`vitlarge.evaluate.as_exported`): what ViT-B/16 at `MAX_IMAGE_SIZE` (64x64) and VOLO's patch 8 at 512 px take, above
every shipped recipe's, while the 16 px demo model's export (patch 4) stating 1,024 px asked 65,536 (attention
grows with their square). Checked before the model is built."""
MAX_PHASES = 1024
"""The most entries ``train.phases`` may hold (a recipe's, or a meta.json's, counted before any entry is read):
`vitlarge.config.phase_list.progressive` makes one per image size, at most `MAX_IMAGE_SIZE`; a million took each
resume 272 s and 2.4 GB."""
MEAN = Rule(lambda *m: all(0 <= x <= 1 for x in m), "three numbers in [0, 1] (pixels are 0..1)", items=3)
STD = Rule(lambda *s: all(0.01 <= x <= 10 for x in s), "three numbers in [0.01, 10] (pixels are 0..1)", items=3)
"""``data.std``'s rule: the pixels are divided by it, so a std of 0 or 1e-30 made every evaluation's loss nan
(exit 0); real data's are 0.2-0.5."""


@dataclass
class ModelConfig:
    name: str = "vit_base_patch16_224"
    """timm model name; the classifier gets ``data.num_classes`` outputs."""
    pos_drop_rate: float = ruled(0.0, PROBABILITY)
    """Dropout after adding position embeddings (timm ``pos_drop_rate``)."""
    attn_drop_rate: float = ruled(0.0, PROBABILITY)
    """Dropout on attention probabilities (timm ``attn_drop_rate``)."""
    proj_drop_rate: float = ruled(0.0, PROBABILITY)
    """Dropout after the attention projection and in the MLP (timm ``proj_drop_rate``)."""
    head_drop_rate: float = ruled(0.0, PROBABILITY)
    """Dropout before the classifier; timm 1.x calls this ``drop_rate``."""
    drop_path_rate: float = ruled(0.0, PROBABILITY)
    """Stochastic depth: the largest per-block drop probability (see ``drop_path_schedule``)."""
    drop_path_schedule: Literal["linear", "uniform"] = "linear"
    """``linear``: timm's spread, block i of n drops with ``drop_path_rate * i / (n - 1)`` (0 in the first
    block). ``uniform``: ``drop_path_rate`` in every block, as DeiT III's ``models_v2.py`` trains."""
    fused_attn: Literal["auto", "on", "off"] = "auto"
    """``on``/``off``/``auto`` for scaled-dot-product attention; ``auto`` turns it off only for fp16 on CPU,
    where PyTorch 2.5's fused attention backward is ~5x slower than the unfused one (measured)."""
    kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments for ``timm.create_model`` (e.g. ``patch_size``, ``embed_dim``, ``depth``)."""
    init_from: str = ""
    """Start from these weights (fine-tuning): an export folder or its ``model.safetensors``, a
    ``checkpoints/step_*`` folder, or a timm checkpoint file. Weights only; the position embedding is
    resampled to ``data.image_size`` and a classifier of another class count re-initialised
    (`vitlarge.checkpoint.init_from`). A resumed run takes its checkpoint's weights instead."""


@dataclass
class DataConfig:
    source: Literal["tfrecord", "synthetic"] = "tfrecord"
    """``tfrecord``: DALI over the shards in ``data.path``. ``synthetic``: random images and labels made on the
    device (`vitlarge.data.synthetic`: no files, no DALI, ``data.path`` unused), for throughput checks and
    runs on a machine without the data set: ``data.num_train_examples`` per epoch, a fixed validation set of
    ``data.synthetic_val_examples``, ``data.num_classes`` classes named ``class_0000``...; the crop, flip, RandAugment,
    3-Augment and colour jitter settings do not apply (Mixup/CutMix and label smoothing do). See docs/DATA.md."""
    path: str = ""
    """Directory of TFRecord shards with ``dataset.json`` (``--data`` sets it)."""
    num_classes: int = ruled(1000, COUNT)
    """Classes of the data set; must match ``dataset.json`` (the classifier has this many outputs)."""
    num_train_examples: int = ruled(IMAGENET_TRAIN_EXAMPLES, COUNT)
    """Examples per epoch for ``--dry-run`` and for ``data.source=synthetic`` (ImageNet-1k's train split by
    default, so the recipes' step counts are ImageNet's); a tfrecord run takes the count from ``dataset.json``."""
    synthetic_val_examples: int = ruled(512, COUNT)
    """Size of the fixed validation set of ``data.source=synthetic`` (the same images at any world size)."""
    image_size: int = ruled(224, IMAGE_SIZE)
    """Side in pixels of the square training and validation images."""
    num_threads: int = ruled(0, Rule(lambda v: v >= 0, ">= 0 (0: the process's CPU share from its launcher)"))
    """DALI worker threads per process; 0: the process's CPU share from its launcher
    (``vitlarge.distributed.threads.dali_threads``: affinity mask / tasks on the node, Slurm's binding and
    ``--cpus-per-task``; not torchrun's blanket ``OMP_NUM_THREADS=1``). A recipe's value wins."""
    crop_scale: tuple = ruled((0.08, 1.0), CROP_SCALE)
    """Area fraction range of the random-resized crop."""
    crop_ratio: tuple = ruled(
        (3 / 4, 4 / 3), Rule(lambda lo, hi: 0 < lo <= hi, "(low, high) with 0 < low <= high", items=2)
    )
    """Aspect ratio range (width / height) of the random-resized crop."""
    hflip: bool = True
    """Random horizontal flips in training."""
    randaugment: str | None = None
    """timm's RandAugment string with timm's meaning, run in DALI: ``"rand-m9-n2"``, DeiT's
    ``"rand-m9-mstd0.5-inc1"`` (parts m, n, p, mstd, mmax, inc; see docs/DATA.md); None disables it."""
    crop: Literal["rrc", "src"] = "rrc"
    """Training crop: ``rrc``, the random-resized crop (``crop_scale``, ``crop_ratio``); ``src``, DeiT III's
    simple random crop: shorter side to ``image_size``, a random ``image_size`` square of the image
    reflect-padded by 4 pixels (``crop_scale`` and ``crop_ratio`` unused). Then the flip (``hflip``)."""
    src_padding: int = ruled(4, Rule(lambda v: v >= 0, ">= 0 (DeiT III pads by 4)"))
    """Reflect padding of the simple random crop (``crop="src"``), in pixels: DeiT III's 4 at 192 and 224 px, a
    shift of up to 2%; small images (the demo's 16 px) want less."""
    train_interpolation: Literal["bilinear", "bicubic"] = "bilinear"
    """How training crops are resized to ``image_size`` (timm's ``--train-interpolation``; DeiT trains with
    ``bicubic``). Validation resizes bicubically either way, as timm evaluates."""
    three_augment: bool = False
    """DeiT III's 3-Augment, run in DALI: per image one of grayscale, solarization (threshold 128) or
    Gaussian blur (PIL's, radius uniform in 0.1..2), equally likely (`vitlarge.data.deit_augment`). DeiT III uses it
    instead of RandAugment: setting both is an error."""
    color_jitter: float = ruled(0.0, Rule(lambda v: v >= 0, ">= 0 (0: off; DeiT III uses 0.3)"))
    """Colour jitter strength ``s`` (torchvision's ``ColorJitter(s, s, s)``, after 3-Augment): brightness,
    contrast and saturation factors each uniform in max(0, 1 - s)..1 + s, in a random order; 0 is off.
    DeiT III uses 0.3 with ``three_augment``."""
    hw_decoder_load: float = ruled(0.65, FRACTION)
    """On a GPU, the share of the training JPEGs that the ``mixed`` decoder hands to the GPU's hardware JPEG decoder
    where it has one (A100, H100, H200 and later; DALI's ``hw_decoder_load``, whose default is 0.65); the rest go
    to nvJPEG's CUDA and CPU paths. No effect on the CPU. Not measured yet (DALI has not run on a GPU here: the GPU
    kit's data step, benchmarks/gpu/data.py, measures 0 and 1 against it); until then it stays at DALI's default
    (DALI kept 0.65 after measuring 0.90 at +1.8% iterations/s with a worse decode tail on ImageNet training, its
    pull request 6366), and the dry run's CPU cores per GPU are those of decoding on the CPU, an upper bound."""
    rrc_decode: Literal["roi", "full"] = "roi"
    """How the random-resized crop (``crop="rrc"``) decodes: ``roi``, only the crop's window, straight from the
    JPEG (DALI's ``decoders.image_random_crop``); ``full``, the whole image, then the crop and resize on the
    pipeline's device (``decoders.image`` + ``random_resized_crop``). The same distribution of crops, another
    random stream; on the CPU ``full`` decodes more pixels."""
    repeats: int = ruled(1, COUNT)
    """Repeated augmentation (timm's ``RepeatAugSampler``, DeiT's ``RASampler``; 1 is off): every epoch a fresh
    permutation of the training records, each of its first ``1 / repeats`` taken ``repeats`` times, its copies
    dealt to consecutive ranks (different ranks where the world size is at least ``repeats``), each copy augmented
    independently. An epoch keeps its length, ``ceil(n / world)`` records per rank (timm's ``selected_round=0``),
    so it shows about ``n / repeats`` distinct images. DeiT and DeiT III pretrain with 3. See docs/DATA.md."""
    read_workers: int = ruled(0, Rule(lambda v: v >= 0, ">= 0 (0: the training process reads the records)"))
    """With ``repeats > 1``: processes that read and parse the records (DALI's parallel external source), off
    the training thread; 0 reads them in it. The stream is the same for any count. Each worker imports torch
    (~400 MB private memory, ~5 s to start) and passes batches through ``/dev/shm``; from a local disk the
    training thread spends ~2 ms per batch of 64 reading (docs/DATA.md), so workers are for file systems
    whose reads wait. Unused without repeats."""
    val_crop_pct: float = 0.875
    """Validation resizes the shorter side to ``image_size / val_crop_pct``, then centre-crops."""
    rect_val: bool = False
    """Rectangular validation (fast.ai/DIUx imagenet18's ``rect_val``): the validation split, stored sorted by aspect
    ratio (the converter writes it so), is read in batches of consecutive images, each resized as above and
    centre-cropped to its batch's mean aspect ratio instead of a square (the shorter side the eval size, the
    longer rounded to whole patches; the model resamples its position embedding to the rectangular grid), so
    less of each image is cut away. Every image counts once and a pass gives the same numbers at any world
    size, as the square crop's; training is unchanged. A phase may set its own (``rect_val`` in
    ``train.phases``, as fast.ai's last phase does). Needs a data set converted with the validation images'
    sizes (an older one is refused in one line with the fix); ``data.source=synthetic`` ignores it. See
    docs/PROGRESSIVE.md#rectangular-validation."""
    mean: tuple = ruled(IMAGENET_MEAN, MEAN)
    """Per-channel RGB mean subtracted from the pixels, in timm's 0..1 convention (ImageNet's)."""
    std: tuple = ruled(IMAGENET_STD, STD)
    """Per-channel RGB standard deviation the pixels are divided by, 0..1 convention (ImageNet's)."""
    label_offset: int | None = None
    """Subtracted from stored labels; None takes it from ``dataset.json`` (1 for TF-made shards)."""

    def problems(self) -> Iterator[Problem]:
        """What its fields allow only together."""
        if self.crop == "src" and self.src_padding >= self.image_size:
            yield Problem(
                ("data.src_padding", "data.image_size", "data.crop"),
                f"data.src_padding={self.src_padding} is not below data.image_size={self.image_size} "
                "(reflect padding needs more pixels than it pads); set data.src_padding=4 (DeiT III) or less",
            )
        if self.three_augment and self.randaugment:  # DeiT III uses one or the other
            yield Problem(
                ("data.three_augment", "data.randaugment"),
                f"data.three_augment=true and data.randaugment={self.randaugment!r} are both set; "
                "DeiT III uses one or the other: set data.randaugment=none or data.three_augment=false",
            )
        if not (0 < self.val_crop_pct <= 1):
            yield Problem(
                ("data.val_crop_pct",),
                f"data.val_crop_pct must be in (0, 1], got {self.val_crop_pct}; set it like data.val_crop_pct=0.875",
            )


@dataclass
class AugmentConfig:
    mixup_alpha: float = ruled(0.0, NON_NEGATIVE)
    """Mixup Beta(alpha, alpha) parameter (timm ``Mixup``); 0 disables Mixup. Needs an even micro batch."""
    cutmix_alpha: float = ruled(0.0, NON_NEGATIVE)
    """CutMix Beta parameter; 0 disables CutMix. With both on, timm switches between them per batch."""
    mixup_prob: float = ruled(1.0, FRACTION)
    """Probability that Mixup/CutMix is applied to a batch."""
    label_smoothing: float = ruled(0.0, PROBABILITY)
    """Label smoothing of the targets (folded into the soft targets under Mixup/CutMix, so with ``loss=bce`` too). 0:
    the recipes vitlarge reproduces train without (DeiT III sets ``--smoothing 0.0``). timm's train.py and DeiT's
    main.py default to 0.1: to compare with them, set it to what their command line gives (docs/DATA.md)."""
    loss: Literal["ce", "bce"] = "ce"
    """``ce``: softmax cross-entropy. ``bce``: per-class binary cross-entropy on the one-hot targets (Mixup/CutMix-
    mixed and smoothed as for ``ce``), averaged over images and classes: timm's ``BinaryCrossEntropy``, as DeiT III
    trains. Smoothing puts ``label_smoothing / num_classes`` on every class (timm's off value)."""
    bce_target_thresh: float | None = None
    """``bce`` only: targets above this become 1, the rest 0 (timm's ``target_threshold``; DeiT III's ``> 0``
    is 0.0, so both classes of a mixed pair count fully); None keeps the soft targets."""
    random_erase_prob: float = ruled(0.0, FRACTION)
    """Probability that a training image gets one rectangle of per-pixel normal noise: timm's ``RandomErasing``
    (mode ``pixel``, one region, area 2-33%, aspect 0.3-3.3) on the device, after normalisation and after
    Mixup/CutMix, each image of each micro-batch drawn on its own; 0 is off; validation never erases. After Mixup is
    timm's train.py default order (its prefetcher erases the mixed batch); erasing first trained lower on the digits
    peer benchmark (docs/DATA.md). DeiT III's own recipe erases nothing (recipes/deit3_b16.py: 0)."""

    def problems(self) -> Iterator[Problem]:
        """What its fields allow only together."""
        thresh = self.bce_target_thresh
        if thresh is not None and not (_finite(thresh) and 0 <= thresh < 1):
            yield Problem(
                ("augment.bce_target_thresh",),
                f"'augment.bce_target_thresh' must be in [0, 1) or None, got {thresh}; "
                "set it like augment.bce_target_thresh=0.0 (DeiT III) or augment.bce_target_thresh=none",
            )
        if thresh is not None and self.loss != "bce":
            yield Problem(
                ("augment.bce_target_thresh", "augment.loss"),
                f"augment.bce_target_thresh={thresh} applies to augment.loss=bce only, got "
                f"augment.loss={self.loss}; set augment.loss=bce or augment.bce_target_thresh=none",
            )


@dataclass
class OptimConfig:
    name: Literal["lamb", "adamw"] = "lamb"
    """``lamb`` (vitlarge's multi-tensor LAMB) or ``adamw``."""
    lr: float = ruled(1.8e-2, POSITIVE)
    """Peak learning rate, reached at the end of warmup."""
    weight_decay: float = ruled(0.1, NON_NEGATIVE)
    """Applied to matrices only; biases, norms, pos-embed and cls token get none (and no trust ratio)."""
    betas: tuple = ruled((0.9, 0.999), Rule(lambda a, b: 0 <= a < 1 and 0 <= b < 1, "two numbers in [0, 1)", items=2))
    """Adam/LAMB moment decay rates (beta1, beta2)."""
    eps: float = ruled(1e-6, POSITIVE)
    """Added to the second moment's square root for stability."""
    bias_correction: bool = True
    """LAMB's Adam-style bias correction of the moments (vitlarge's LAMB; AdamW always corrects)."""
    implementation: Literal["auto", "chunked", "foreach", "compiled"] = "auto"
    """How vitlarge's LAMB runs its step: the same update and the same state dict (checkpoints) in every form
    (`vitlarge.optim.lamb.Lamb`). ``chunked``: tensors in chunks of 4M elements that stay in a CPU's cache between the
    ops of one step. ``foreach``: every parameter of a group at once, one multi-tensor kernel per op instead of one per
    chunk (a GPU's launches), holding one update direction per parameter during the step (+4 bytes per parameter,
    per rank's shard under fsdp). ``compiled``: the step through ``torch.compile`` in two passes (moments and norms;
    the update, recomputing the direction), the traffic a two-pass LAMB needs at least, compiled at the first step.
    ``auto``: ``chunked`` on CPU, ``foreach`` on CUDA (`vitlarge.train.settings.lamb_implementation`). ``adamw``
    ignores it."""
    clip_grad_norm: float = ruled(1.0, Rule(lambda v: v >= 0, ">= 0 (0: no clipping)"))
    """Global L2 norm, applied after fp16 unscaling; 0 disables clipping (the norm is still logged)."""
    layer_decay: float = ruled(1.0, Rule(lambda v: 0 < v <= 1, "in (0, 1] (1.0: no layer-wise lr decay)"))
    """Layer-wise lr decay for fine-tuning (BEiT, MAE; timm's ``--layer-decay``), in (0, 1]; 1.0 is off. Layers as
    timm's ``param_groups_layer_decay`` numbers them: patch embedding, cls token and position embedding 0, block i
    i + 1 (the final norm with the last block), the head depth + 1; a layer's lr is the schedule's times
    ``layer_decay ** (depth + 1 - layer)``. Composes with the no-weight-decay split (no decay and no LAMB trust
    ratio for 1-D parameters such as LayerScale's gamma)."""


@dataclass
class ScheduleConfig:
    warmup_epochs: float = ruled(0.0, NON_NEGATIVE)
    """Linear warmup from 0 to ``optim.lr``, in epochs; converted once to optimizer steps."""
    decay: Literal["linear", "cosine", "constant"] = "linear"
    """``linear``, ``cosine`` or ``constant`` after warmup."""
    min_lr_ratio: float = ruled(0.0, FRACTION)
    """Final lr as a fraction of the peak."""
    on_edit: Literal["continue", "recipe"] = "continue"
    """A resume whose schedule changed since its checkpoint (``train.epochs``, ``train.global_batch``, warmup, decay,
    ``optim.lr`` edited), where this recipe's lr at the resume step differs from the one the checkpoint's own plan
    had there: ``continue`` goes on from the checkpoint's lr and re-plans the rest of the warmup or decay to reach
    this recipe's peak or floor at its own steps (no jump; recorded in each later checkpoint, so requeues keep it);
    ``recipe`` takes this recipe's lr at that step, as timm's and torchtitan's schedulers do when rebuilt from an
    edited config (a jump: a warm restart when a finished run's epochs are extended). A resume prints what changed
    either way (README, "Resuming under an edited recipe")."""


PHASE_KEYS = (
    "epoch",
    "image_size",
    "eval_size",
    "global_batch",
    "micro_batch",
    "crop_scale",
    "lr_scale",
    "lr",
    "rect_val",
)
"""The keys of a ``train.phases`` entry (`PhaseEntry`'s fields)."""


@dataclass(frozen=True)
class PhaseEntry:
    """One entry of ``train.phases``: as the recipe (or an override) wrote it, None where the phase inherits (carried
    over from the phase before, or the recipe's), or resolved, every key filled in and checked
    (`vitlarge.config.phase_list.resolve_phases`; world-size free: what the phase list's fingerprint hashes, less the
    fields marked ``fingerprint=False``: ``rect_val`` only changes how a phase is validated, so editing it keeps a
    checkpoint's data stream). ``given``: the keys that were set, in their order (all of them once resolved);
    `to_dict` writes those alone (the dict form a checkpoint's meta.json keeps). Values are kept as written
    (``crop_scale`` a list or a tuple, ``epoch`` an int or a float; resolved: ``crop_scale`` and ``lr`` as tuples of
    floats), so the dict form, and the phase list's fingerprint, are the bytes a dict list gave."""

    epoch: float | None = None
    image_size: int | None = None
    eval_size: int | None = None
    global_batch: int | None = None
    micro_batch: int | None = None
    crop_scale: tuple[float, float] | None = None
    lr_scale: float | None = None
    lr: tuple[float, float] | None = None
    rect_val: bool | None = field(default=None, metadata={"fingerprint": False})
    given: tuple[str, ...] = field(default=(), metadata={"fingerprint": False})

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> PhaseEntry:
        """From a dict of `PHASE_KEYS` (its keys checked by the caller: `vitlarge.config.phase_list`)."""
        return cls(**entry, given=tuple(entry))

    def to_dict(self) -> dict[str, Any]:
        """The keys that were set, as written (a copy)."""
        return {k: copy.deepcopy(getattr(self, k)) for k in self.given}


@dataclass
class TrainConfig:
    global_batch: int = ruled(32768, COUNT)
    """Images per optimizer step over all devices; fixed by the recipe, whatever the world size."""
    micro_batch: int = ruled(256, COUNT)
    """Images per device per forward/backward; accumulation = global / (micro x world)."""
    epochs: float = ruled(300, EPOCHS)
    """Length of the schedule in epochs; converted once to optimizer steps."""
    precision: Literal["fp16", "bf16", "fp32", "auto"] = "fp16"
    """``fp16`` (autocast + dynamic loss scaling), ``bf16`` (autocast), ``fp32``, or ``auto``: the fastest
    the device trains in, resolved at start (`vitlarge.model.precision.choose_precision`): bf16 on GPUs with bf16
    tensor cores, else fp16; on CPUs fp16/bf16 only with fast units for them, else fp32."""
    init_loss_scale: float = ruled(2.0**16, POSITIVE)
    """Initial fp16 loss scale (dynamic: halved on overflow, doubled after ``loss_scale_growth_interval``)."""
    loss_scale_growth_interval: int = ruled(2000, COUNT)
    """Optimizer steps without overflow after which the fp16 loss scale doubles."""
    compile: Literal["auto", "on", "off"] = "auto"
    """``on``: the model's forward (and so its backward) runs through ``torch.compile`` (the whole model or each
    block: ``train.compile_scope``; `nn.Module.compile` before the Booster: parameter names, checkpoints and
    exports unchanged; static shapes, one graph per input shape and train/eval, the recompile limit sized to the
    phases: `vitlarge.train.assemble.compile_model`).
    ``auto``: on with CUDA, off on CPU, where it measured slower (0.8x) and costs minutes of compiling
    (docs/PERFORMANCE.md); resolved at start and logged (`vitlarge.train.settings.compile_choice`)."""
    compile_scope: Literal["auto", "model", "blocks"] = "auto"
    """What ``train.compile`` compiles. ``model``: the whole forward as one graph. ``blocks``: each transformer block
    on its own, as torchtitan's ``apply_compile`` does (the patch embedding, tokens, final norm and head stay eager):
    compiled before FSDP shards it, so FSDP2's per-block hooks run between the compiled blocks instead of breaking a
    whole-model graph at every block, and DDP's gradient buckets all-reduce while the blocks before them still run
    their backward. ``auto``: ``blocks`` under ``train.plugin=fsdp``, ``model`` under ddp (measured on one H200 for
    vit_b16; ``blocks`` is selectable to measure against it). Parameter names and checkpoints are the plain model's
    either way (`vitlarge.train.assemble.compile_model`)."""
    activation_checkpointing: Literal["off", "full", "selective"] = "off"
    """Recomputation of block activations in backward. ``full``: each block keeps only its input and recomputes
    its forward (timm's ``set_grad_checkpointing``; the key ``model.grad_checkpointing=true`` before): least memory, one more
    forward of the blocks. ``selective``: each block keeps the outputs of its matrix multiplies and attention and
    recomputes the cheap ops between them (norms, GELU, dropout, residual adds): no second GEMM, and 0.48x the
    activations ``off`` keeps (ViT-S/16 at 128 px, fp32, CPU; `vitlarge.model.recompute`). Losses and gradients
    equal ``off``'s; docs/PERFORMANCE.md section 12."""
    plugin: Literal["ddp", "fsdp"] = "ddp"
    """Colossal-AI Booster plugin: ``ddp`` (TorchDDPPlugin: replicas) or ``fsdp`` (`vitlarge.distributed.fsdp`: weights,
    gradients and LAMB states sharded over the ranks by FSDP2, one group per transformer block; CPU and CUDA)."""
    fsdp_accumulation: Literal["auto", "no_sync", "reduce_scatter"] = "auto"
    """``fsdp`` with gradient accumulation: ``no_sync`` keeps full unsharded gradients between micro-steps
    and reduce-scatters once per optimizer step (least traffic, +1 unsharded fp32 gradient of memory per rank;
    FSDP2 accumulates it in fp32 under bf16/fp16 too); ``reduce_scatter`` reduce-scatters
    every micro-step into this rank's fp32 shard (least memory, ``accum_steps`` x the gradient traffic);
    ``auto``: reduce_scatter under bf16/fp16, no_sync under fp32. See docs/FSDP.md."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """``auto`` (cuda when available), ``cuda`` or ``cpu``."""
    seed: int = ruled(42, Rule(lambda v: 0 <= v < 2**31, "in [0, 2**31)"))
    """Initial weights (same on every rank); data order and augmentation use it with the rank."""
    deterministic: bool = True
    """What a resume equal to the uninterrupted run bit for bit needs on CUDA (`vitlarge.train.settings.
    apply_determinism`): ``torch.use_deterministic_algorithms(True)`` (strict: an op with no deterministic
    kernel raises, and the run says to set this off), cuDNN's deterministic algorithms without benchmarking
    (the patch embedding's convolution), ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless set, and no filling of
    new tensors (vitlarge reads none uninitialised). The cost is small for a ViT; docs/RELIABILITY.md says
    what it is and what is not bitwise when off. On CPU the kernels vitlarge uses are deterministic already."""
    init_timeout_s: float = ruled(1800, POSITIVE)
    """Seconds a rank waits in the rendezvous and in any collective until a phase's first optimizer step has
    completed: every process joining (Slurm starting tasks, a container image pulled per node), then per-rank work
    between two collectives that the steady state does not have: ``train.compile`` (minutes per graph, not the
    same on every rank), the first fill of DALI's shuffle buffer, a resume's checkpoint read, each phase's loader
    rebuild and recompile. Evaluations and checkpoints wait this long too, whenever they come (eval's first
    pass compiles its graph; a checkpoint's commit waits for every rank's shard to be written and read back).
    torchtitan's ``comm.init_timeout_seconds`` (default 300) separates it for this reason.
    ``VITLARGE_RENDEZVOUS_TIMEOUT``, when set, still bounds the rendezvous alone."""
    collective_timeout_s: float = ruled(600, POSITIVE)
    """Seconds a rank waits in a training step's collectives after a phase's first step (evaluations and
    checkpoints wait ``train.init_timeout_s``): short enough that a hung rank (a stuck file system, a dead GPU)
    ends the job in minutes, not hours. Under gloo (CPU) every rank then ends with one line naming the collective
    and the ranks that did not report it, exit status 124 (`vitlarge.distributed.timeouts`); under NCCL (GPU)
    the watchdog aborts the process at the same timeout (status 134, NCCL's own line; not yet seen on a GPU).
    torchtitan's ``comm.train_timeout_seconds`` (default 100) is the same idea; NCCL's own default is 600."""
    log_every_steps: int = ruled(10, COUNT)
    """A console progress line every this many optimizer steps (metrics.jsonl has every step)."""
    eval_every_epochs: float = ruled(
        10, Rule(lambda v: 0 <= v <= MAX_EPOCHS, f">= 0 and at most {MAX_EPOCHS:,} (0: only the final evaluation)")
    )
    """Evaluate every this many epochs (rounded to steps, at least 1); 0: only the final evaluation."""
    checkpoint_every_steps: int = ruled(500, Rule(lambda v: v >= 0, ">= 0 (0: no periodic checkpoints)"))
    """0: never periodically; a checkpoint is still written at the end and on SIGTERM/SIGUSR1."""
    keep_checkpoints: int = ruled(3, COUNT)
    """Newest checkpoints kept (at least 1); older ones are deleted after each save."""
    nan_patience: int = ruled(5, COUNT)
    """Stop when the loss is non-finite this many optimizer steps in a row."""
    max_steps: int = ruled(0, Rule(lambda v: v >= 0, ">= 0 (0: the whole schedule)"))
    """Stop after this many optimizer steps (0: run the whole schedule). The schedule still spans all epochs."""
    profile_steps: str | None = None
    """``"START-END"``: record optimizer steps START..END (1-based, both included) with ``torch.profiler`` on every
    rank, one trace per rank under ``<workdir>/profile/`` (TensorBoard's profiler plugin and Perfetto read it), and
    print the top operators by self time on rank 0 (`vitlarge.train.profile`). None (the default): no profiler.
    A resumed run records the part of the window after its checkpoint's step. See docs/LOGS.md#profiling-steps."""
    ema_decay: float = ruled(0.0, Rule(lambda v: 0 <= v < 1, "in [0, 1) (0: no model EMA; timm uses 0.9998)"))
    """Model EMA: an fp32 moving average of the weights, ``ema = decay * ema + (1 - decay) * weights`` after every
    applied optimizer step (timm's ``ModelEmaV3``; `vitlarge.model.ema`), sharded like the weights under fsdp,
    checkpointed, evaluated beside them (``val_top1_ema``); in [0, 1), 0 is off. timm's examples and DeiT's main.py (0.99996) keep one; DeiT III's published models are the raw weights."""
    ema_warmup: bool = False
    """timm ``ModelEmaV3``'s ``use_warmup``: after step ``n + 1`` the decay is ``min(ema_decay, 1 - (1 + n) ** (-2/3))``
    (0.9 after 32 steps, 0.99 after 1000), so the average forgets the early weights quickly."""
    export_ema: bool = False
    """The timm export (``<workdir>/model``) holds the EMA weights instead of the raw ones (needs ``ema_decay``);
    its config.json says which (``vitlarge_weights``: ``ema`` or ``raw``)."""
    phases: list[PhaseEntry] = field(default_factory=list)
    """Progressive resolution: phases with their own image size, batch, crop scale and lr. A recipe may write
    them as dicts (``[{"epoch": 0, "image_size": 128}, {"epoch": 80, "image_size": 224}]``):
    `vitlarge.config.load.validate` checks them and makes them `PhaseEntry`s. [] trains one phase from the
    fields above. Keys and rules: `vitlarge.config.phase_list`."""

    def problems(self) -> Iterator[Problem]:
        """What its fields allow only together."""
        if self.global_batch % self.micro_batch:
            yield Problem(
                ("train.global_batch", "train.micro_batch"),
                f"train.global_batch={self.global_batch} is not a multiple of train.micro_batch={self.micro_batch}; "
                "change one of them",
            )
        if (self.export_ema or self.ema_warmup) and self.ema_decay == 0:
            key = "train.export_ema" if self.export_ema else "train.ema_warmup"
            yield Problem(
                (key, "train.ema_decay"),
                f"{key}=true needs a model EMA, but train.ema_decay=0 (off); "
                f"set train.ema_decay (e.g. train.ema_decay=0.9998) or {key}=false",
            )


@dataclass
class LogConfig:
    mlflow: bool = False
    """Log the run to MLflow (`hooks.mlflow`): every config key as a parameter, each step's and evaluation's
    metrics, the export and ``metrics.png`` as artifacts; main rank only, off the training thread. Needs
    ``pip install -r requirements/trackers.txt``."""
    mlflow_uri: str | None = None
    """MLflow tracking URI (``http://host:5000``, ``sqlite:///path/mlflow.db``, ``postgresql://...``, ``databricks``);
    None: ``MLFLOW_TRACKING_URI``, else ``sqlite:///<workdir>/mlflow.db`` (no server needed)."""
    wandb: bool = False
    """Log the run to Weights & Biases (`hooks.wandb`), configured by its own variables (``WANDB_PROJECT``,
    ``WANDB_ENTITY``, ``WANDB_MODE=offline``, ...); main rank only, off the training thread."""
    wandb_project: str | None = None
    """The W&B project; None: ``WANDB_PROJECT``, else the experiment name (``log.experiment``)."""
    experiment: str | None = None
    """MLflow experiment (and W&B's default project); None: the recipe's name (``demo_digits``)."""


@dataclass
class Config:
    """A whole run. Recipes build one; ``--set`` style overrides edit it by dotted key."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """What to train: the timm model and its dropouts."""
    data: DataConfig = field(default_factory=DataConfig)
    """The data set (TFRecord shards, or synthetic) and its input pipeline."""
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    """Batch-level augmentation (Mixup, CutMix, label smoothing) and the loss on its targets."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer, its parameter groups (layer-wise lr decay) and gradient clipping."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Learning-rate schedule: warmup, then decay."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Batch sizes, length, precision, plugin and the run cadence."""
    log: LogConfig = field(default_factory=LogConfig)
    """Experiment trackers (MLflow, Weights & Biases); the console, metrics.jsonl and TensorBoard are always on."""
    workdir: str = "runs/default"
    """Logs, metrics, checkpoints and the exported model go here; a rerun resumes from it."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data (meta.json's ``config``): ``train.phases`` as dicts of the keys each entry set."""
        d = dataclasses.asdict(self)
        d["train"]["phases"] = [
            p.to_dict() if isinstance(p, PhaseEntry) else q for p, q in zip(self.train.phases, d["train"]["phases"])
        ]
        return d

    def problems(self) -> Iterator[Problem]:
        """What the fields allow only together, section by section, then across sections (ranges and types:
        `vitlarge.config.checks.validate`, from each field's `Rule` and type; the micro batches Mixup needs even, the
        recipe's and each phase's: `vitlarge.config.phase_list.check`)."""
        yield from self.train.problems()
        yield from self.augment.problems()
        a, t = self.augment, self.train
        smoothed_off = a.label_smoothing / self.data.num_classes  # the value smoothing gives every other class
        if a.bce_target_thresh is not None and a.loss == "bce" and a.bce_target_thresh < smoothed_off:
            yield Problem(
                ("augment.bce_target_thresh", "augment.label_smoothing", "augment.loss"),
                f"augment.bce_target_thresh={a.bce_target_thresh} is below what augment.label_smoothing="
                f"{a.label_smoothing} gives every class ({smoothed_off:.3g}), so every target would be 1; "
                "set augment.label_smoothing=0 (DeiT III) or a threshold above it (timm users pair 0.1 with 0.2)",
            )
        yield from self.data.problems()
        if self.schedule.warmup_epochs > t.epochs:
            yield Problem(
                ("schedule.warmup_epochs", "train.epochs"),
                f"schedule.warmup_epochs={self.schedule.warmup_epochs} exceeds train.epochs={t.epochs}; "
                "lower the warmup or raise train.epochs",
            )


def _get_key(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def field_rules() -> list[tuple[str, Rule]]:
    """``(dotted key, rule)`` of every field that declares a `Rule` (schema order)."""
    out, defaults = [], Config()
    for f in dataclasses.fields(defaults):
        section = getattr(defaults, f.name)
        if dataclasses.is_dataclass(section):
            out += [(f"{f.name}.{g.name}", rule_of(g)) for g in dataclasses.fields(section) if rule_of(g)]
    return out


def check_ranges(cfg: Config, where: Callable[..., str]) -> None:
    """One line per bad value: the key, the rule, the value, and a valid setting (the schema's default).
    ``where(key)``: whom the line blames (`vitlarge.config.checks.Where`)."""
    for key, rule in field_rules():
        value = _get_key(cfg, key)
        if rule.items > 1:
            if not (len(value) == rule.items and all(map(_finite, value)) and rule.test(*value)):
                example = ",".join(f"{x:g}" for x in _get_key(Config(), key))
                raise UserError(f"{where(key)}: '{key}' must be {rule.words}, got {value}; set it like {key}={example}")
        elif not (_finite(value) and rule.test(value)):
            raise UserError(
                f"{where(key)}: '{key}' must be {rule.words}, got {value}; set it like {key}={_get_key(Config(), key)}"
            )
