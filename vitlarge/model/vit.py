"""Builds the timm ViT a recipe names, and sizes it (parameters, FLOPs, memory) without data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch.utils.flop_counter import FlopCounterMode

from vitlarge.config.phase_list import rect_val_anywhere
from vitlarge.config.schema import Config
from vitlarge.errors import UserError
from vitlarge.model import recompute
from vitlarge.model.kwargs import class_built, kwargs_problem


def model_kwargs(cfg: Config) -> dict:
    m = cfg.model
    # timm 1.x: drop_rate is only the head dropout; the original example's single dropout=0.1 maps
    # to the embedding, attention and projection dropouts, which recipes set explicitly.
    kwargs = dict(
        num_classes=cfg.data.num_classes,
        img_size=cfg.data.image_size,
        drop_rate=m.head_drop_rate,
        pos_drop_rate=m.pos_drop_rate,
        attn_drop_rate=m.attn_drop_rate,
        proj_drop_rate=m.proj_drop_rate,
        drop_path_rate=m.drop_path_rate,
        # With phases the input size changes during the run, and rectangular validation (data.rect_val)
        # forwards rectangular grids: the position embedding (of the data.image_size grid) is resampled to
        # each input's grid (vitlarge/plan/phases.py), by a cached matrix with a deterministic backward
        # (_deterministic_pos_embed_class). At the embedding's own grid the forward is the fixed-size one.
        **(dict(dynamic_img_size=True) if cfg.train.phases or rect_val_anywhere(cfg) else {}),
    )
    # The recipe's own kwargs win and may repeat a key set above: evaluating a phased run's export adds
    # dynamic_img_size (vitlarge.evaluate.as_exported) to a recipe whose phases already set it.
    kwargs.update(m.kwargs)
    return kwargs


def build_model(cfg: Config, device: torch.device | str = "cpu", precision: str | None = None) -> torch.nn.Module:
    """``cfg``'s model on ``device``. ``precision``: what the run trains in (`vitlarge.train.settings.Settings`),
    which picks the attention kernel and the patch convolution on a CPU under fp16; None: a model built for its
    shapes or weights (a check, an export's reader), taking ``train.precision`` as written (``auto`` not as fp16)."""
    import timm  # lazy: keeps timm off a run's pre-flight checks

    try:
        with torch.device(device):
            model = timm.create_model(cfg.model.name, pretrained=False, **model_kwargs(cfg))
    except (RuntimeError, TypeError, ValueError, AssertionError, ArithmeticError) as e:  # timm asserts (global_pool)
        if "Unknown model" in str(e) or "unexpected keyword" in str(e):
            raise UserError(
                f"model.name={cfg.model.name!r} / model.kwargs: {e}; see timm.list_models('vit_*')"
            ) from None
        model_cls = class_built(e.__traceback__)
        problem = kwargs_problem(model_cls, cfg.model.kwargs) if model_cls is not None else None
        if problem is not None:
            raise UserError(problem) from None
        if model_cls is not None and cfg.model.kwargs:  # values of the declared types that timm still refuses
            why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            raise UserError(
                f"model.name={cfg.model.name!r} / model.kwargs={str(cfg.model.kwargs)[:200]}: {model_cls.__name__} refused them "
                f"({why}); fix model.kwargs"
            ) from None
        raise
    problem = kwargs_problem(type(model), cfg.model.kwargs)  # a value timm took without a word (qkv_bias=no)
    if problem is not None:
        raise UserError(problem)
    if cfg.model.drop_path_schedule == "uniform":
        _uniform_drop_path(model, cfg.model.drop_path_rate)
    recompute.apply(model, cfg.train.activation_checkpointing)
    cpu_fp16 = torch.device(device).type == "cpu" and (precision or cfg.train.precision) == "fp16"
    fused = cfg.model.fused_attn == "on" or (cfg.model.fused_attn == "auto" and not cpu_fp16)
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            cast(
                Any, module
            ).fused_attn = fused  # a plain attribute: nn.Module's __setattr__ declares tensors and modules
    if getattr(model, "dynamic_img_size", False) and _plain_pos_embed(model):
        model.__class__ = _deterministic_pos_embed_class(type(model))
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    if cpu_fp16 and type(proj) is torch.nn.Conv2d:
        proj.__class__ = Fp32Conv2d
    return model


def _uniform_drop_path(model: torch.nn.Module, rate: float) -> None:
    """Every residual branch drops with ``rate`` (DeiT III's ``models_v2.py``: ``dpr = [drop_path_rate] *
    depth``) where timm built ``linspace(0, rate, depth)``."""
    from timm.layers import DropPath  # lazy: keeps timm off a run's pre-flight checks

    blocks = getattr(model, "blocks", None)
    branches = [(b, n) for b in blocks or () for n in ("drop_path1", "drop_path2") if hasattr(b, n)]
    if not branches:
        raise UserError(
            f"model.drop_path_schedule=uniform: {type(model).__name__} has no timm blocks with drop_path1/2;"
            " use model.drop_path_schedule=linear"
        )
    for block, name in branches:
        setattr(block, name, DropPath(rate) if rate > 0 else torch.nn.Identity())


def pos_embed_matrix(old_size: tuple[int, int], new_size: tuple[int, int], device: torch.device | str) -> torch.Tensor:
    """The (new_h*new_w, old_h*old_w) fp32 matrix M with ``timm resample_abs_pos_embed(pos) == M @ pos``
    (grid tokens), built by resampling an identity basis once: the resample is linear per channel."""
    from timm.layers import resample_abs_pos_embed  # lazy: keeps timm off a run's pre-flight checks

    n = old_size[0] * old_size[1]
    eye = torch.eye(n, device=device, dtype=torch.float32).unsqueeze(0)  # channel c = basis vector e_c
    with torch.no_grad():
        # torch.fx.wrap, its decorator, is annotated as returning `str | Callable`: the function it was given
        resample = cast(Callable[..., torch.Tensor], resample_abs_pos_embed)
        return resample(eye, new_size=list(new_size), old_size=list(old_size), num_prefix_tokens=0)[0]


def _plain_pos_embed(model: torch.nn.Module) -> bool:
    """A timm VisionTransformer whose ``_pos_embed`` is the stock one (the override below replicates it)."""
    from timm.models.vision_transformer import VisionTransformer  # lazy: keeps timm off a run's pre-flight checks

    return (
        isinstance(model, VisionTransformer)
        and type(model)._pos_embed is VisionTransformer._pos_embed
        and getattr(model, "pos_embed", None) is not None
    )


_CLASSES: dict[type, type] = {}


def _deterministic_pos_embed_class(base: type) -> type:
    """``base`` with a position-embedding resample that is a cached matmul instead of timm's per-forward
    bicubic ``F.interpolate``: the same numbers (up to fp32 rounding), but a deterministic backward.

    Why: the CUDA backward of antialiased bicubic interpolation accumulates with atomicAdd (PyTorch marks
    it non-deterministic), so a phase below ``data.image_size`` would break the bitwise resume promise
    and raise under ``torch.use_deterministic_algorithms``; a matmul's backward is a plain GEMM.
    Parameters, state dict and checkpoints are unchanged (M is a cache, not a buffer)."""
    if base in _CLASSES:
        return _CLASSES[base]

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:  # self: a timm VisionTransformer (_plain_pos_embed)
        B, H, W, C = x.shape
        prefix = 0 if self.no_embed_class else self.num_prefix_tokens
        pos = self.pos_embed
        old = tuple(self.patch_embed.grid_size)
        if (H, W) != old:
            if torch.compiler.is_compiling():
                # Traced into the graph (shapes are static there): Dynamo cannot follow the eager cache's
                # __dict__ mutation and would break the graph in two around it, at every forward.
                matrix = pos_embed_matrix(old, (H, W), pos.device)
            else:
                cache = self.__dict__.setdefault("_pos_embed_matrices", {})
                key = (H, W, pos.device)
                if key not in cache:
                    cache[key] = pos_embed_matrix(old, (H, W), pos.device)
                matrix = cache[key]
            with torch.autocast(pos.device.type, enabled=False):  # fp32, as timm's resample
                grid = (matrix @ pos[0, prefix:].float()).to(pos.dtype).unsqueeze(0)
            pos = torch.cat([pos[:, :prefix], grid], dim=1) if prefix else grid
        x = x.view(B, -1, C)
        to_cat = [t.expand(B, -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if self.no_embed_class:
            x = x + pos
            if to_cat:
                x = torch.cat(to_cat + [x], dim=1)
        else:
            if to_cat:
                x = torch.cat(to_cat + [x], dim=1)
            x = x + pos
        return self.pos_drop(x)

    cls = type(
        base.__name__,
        (base,),
        {"_pos_embed": _pos_embed, "__module__": base.__module__, "__qualname__": base.__qualname__},
    )
    _CLASSES[base] = cls
    return cls


class Fp32Conv2d(torch.nn.Conv2d):
    """A Conv2d that runs in fp32 under autocast (same parameters and state dict as Conv2d).

    PyTorch 2.5 has no fast fp16 convolution backward on CPU: the patch embedding's took 78% of
    an fp16 ViT-S/16 step at 96 px, and the step ran 5.4x slower than with this conv in fp32
    (measured, benchmarks/bench_precision.py).
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        with torch.autocast(input.device.type, enabled=False):
            return super().forward(input.float())


def describe_model(cfg: Config) -> dict:
    """Parameter count and forward FLOPs per image, measured on the meta device (no memory, no data)."""
    model: Any = build_model(cfg, "meta")  # read by timm's attribute names, where the model has them
    size = cfg.data.image_size
    with FlopCounterMode(display=False) as counter:
        model(torch.empty(1, 3, size, size, device="meta"))
    params = sum(p.numel() for p in model.parameters())
    blocks = getattr(model, "blocks", [])
    depth = len(blocks)
    dim = getattr(model, "embed_dim", 0)
    heads = blocks[0].attn.num_heads if depth else 1
    tokens = (
        model.patch_embed.num_patches + getattr(model, "num_prefix_tokens", 1) if hasattr(model, "patch_embed") else 0
    )
    return dict(params=params, fwd_flops=counter.get_total_flops(), depth=depth, dim=dim, heads=heads, tokens=tokens)


def memory_estimate(
    info: dict,
    micro_batch: int,
    precision: str,
    checkpointing: str,
    sharded: bool,
    world: int,
    unsharded_grads: bool = False,
    ema: bool = False,
) -> dict:
    """Rough bytes per device: fp32 ``weights``, fp32 ``grads``, two fp32 LAMB moments (``optimizer``), the
    fp32 model EMA (``ema``: ``train.ema_decay``, sharded like the weights; 0 without), their sum ``states``,
    ``activations`` and the ``total``.

    ``sharded`` (``train.plugin=fsdp``): weights, grads and moments are split over ``world`` ranks, and
    the weights add the blocks FSDP gathers at a time (the current one and the prefetched next) in the
    compute dtype. ``unsharded_grads`` (fsdp accumulating under ``no_sync``, fp32): every rank holds the
    whole fp32 gradient between micro-steps, so ``grads`` is the unsharded 4 bytes per parameter. Activations use Korthikanti et al. (2022): per layer s*b*h*(34 + 5*a*s/h) bytes in
    half precision; fp32 doubles it. ``checkpointing`` (`vitlarge.config.schema.Config.recompute`): ``full`` keeps
    each block's input (2*s*b*h), ``selective`` that and its matmul and attention outputs (qkv 3, attention 1,
    projection 1, MLP 4 + 1: 22*s*b*h with the input; `vitlarge.model.recompute`).
    """
    p = info["params"]
    share = world if sharded else 1
    weights, grads, optimizer = 4 * p / share, 4 * p / share, 8 * p / share
    if sharded and unsharded_grads:
        grads = 4 * p
    if sharded:
        weights += 2 * p / max(info["depth"], 1) * (4 if precision == "fp32" else 2)
    average = 4 * p / share if ema else 0.0
    states = weights + grads + optimizer + average
    s, h, a, L = info["tokens"], info["dim"], info["heads"], info["depth"]
    per_layer = s * micro_batch * h * (34 + 5 * a * s / max(h, 1))
    if precision == "fp32":
        per_layer *= 2
    kept = {"full": 2 * s * micro_batch * h, "selective": 22 * s * micro_batch * h}
    act = L * (kept[checkpointing] * (2 if precision == "fp32" else 1) if checkpointing in kept else per_layer)
    return dict(
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        ema=average,
        states=states,
        activations=act,
        total=states + act,
    )
