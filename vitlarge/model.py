"""Builds the timm ViT a recipe names, and sizes it (parameters, FLOPs, memory) without data."""

from __future__ import annotations

import torch

from vitlarge.config import Config
from vitlarge.errors import UserError


def model_kwargs(cfg: Config) -> dict:
    m = cfg.model
    # timm 1.x: drop_rate is only the head dropout; the original example's single dropout=0.1 maps
    # to the embedding, attention and projection dropouts, which recipes set explicitly.
    return dict(
        num_classes=cfg.data.num_classes,
        img_size=cfg.data.image_size,
        drop_rate=m.head_drop_rate,
        pos_drop_rate=m.pos_drop_rate,
        attn_drop_rate=m.attn_drop_rate,
        proj_drop_rate=m.proj_drop_rate,
        drop_path_rate=m.drop_path_rate,
        # With phases the input size changes during the run: the position embedding (of the
        # data.image_size grid) is resampled to each input's grid (vitlarge/phases.py).
        **(dict(dynamic_img_size=True) if cfg.train.phases else {}),
        **m.kwargs,
    )


def build_model(cfg: Config, device: torch.device | str = "cpu") -> torch.nn.Module:
    import timm

    try:
        with torch.device(device):
            model = timm.create_model(cfg.model.name, pretrained=False, **model_kwargs(cfg))
    except (RuntimeError, TypeError) as e:
        if "Unknown model" in str(e) or "unexpected keyword" in str(e):
            raise UserError(f"model.name={cfg.model.name!r} / model.kwargs: {e}; see timm.list_models('vit_*')") from None
        raise
    if cfg.model.grad_checkpointing:
        model.set_grad_checkpointing(True)
    fused = cfg.model.fused_attn == "on" or (
        cfg.model.fused_attn == "auto" and not (torch.device(device).type == "cpu" and cfg.train.precision == "fp16")
    )
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = fused
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    if torch.device(device).type == "cpu" and cfg.train.precision == "fp16" and type(proj) is torch.nn.Conv2d:
        proj.__class__ = Fp32Conv2d
    return model


class Fp32Conv2d(torch.nn.Conv2d):
    """A Conv2d that runs in fp32 under autocast (same parameters and state dict as Conv2d).

    PyTorch 2.5 has no fast fp16 convolution backward on CPU: the patch embedding's took 78% of
    an fp16 ViT-S/16 step at 96 px, and the step ran 5.4x slower than with this conv in fp32
    (measured, benchmarks/bench_precision.py).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x.float())


def describe_model(cfg: Config) -> dict:
    """Parameter count and forward FLOPs per image, measured on the meta device (no memory, no data)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(cfg, "meta")
    size = cfg.data.image_size
    with FlopCounterMode(display=False) as counter:
        model(torch.empty(1, 3, size, size, device="meta"))
    params = sum(p.numel() for p in model.parameters())
    blocks = getattr(model, "blocks", [])
    depth = len(blocks)
    dim = getattr(model, "embed_dim", 0)
    heads = blocks[0].attn.num_heads if depth else 1
    tokens = model.patch_embed.num_patches + getattr(model, "num_prefix_tokens", 1) if hasattr(model, "patch_embed") else 0
    return dict(params=params, fwd_flops=counter.get_total_flops(), depth=depth, dim=dim, heads=heads, tokens=tokens)


def memory_estimate(info: dict, micro_batch: int, precision: str, grad_checkpointing: bool, sharded: bool,
                    world: int, unsharded_grads: bool = False) -> dict:
    """Rough bytes per device: fp32 ``weights``, fp32 ``grads``, two fp32 LAMB moments (``optimizer``),
    their sum ``states``, ``activations`` and the ``total``.

    ``sharded`` (``train.plugin=fsdp``): weights, grads and moments are split over ``world`` ranks, and
    the weights add the blocks FSDP gathers at a time (the current one and the prefetched next) in the
    compute dtype. ``unsharded_grads`` (fsdp accumulating under ``no_sync``, fp32): every rank holds the
    whole fp32 gradient between micro-steps, so ``grads`` is the unsharded 4 bytes per parameter. Activations use Korthikanti et al. (2022): per layer s*b*h*(34 + 5*a*s/h) bytes in
    half precision; fp32 doubles it. With activation checkpointing only each block's input is kept.
    """
    p = info["params"]
    share = world if sharded else 1
    weights, grads, optimizer = 4 * p / share, 4 * p / share, 8 * p / share
    if sharded and unsharded_grads:
        grads = 4 * p
    if sharded:
        weights += 2 * p / max(info["depth"], 1) * (4 if precision == "fp32" else 2)
    states = weights + grads + optimizer
    s, h, a, L = info["tokens"], info["dim"], info["heads"], info["depth"]
    per_layer = s * micro_batch * h * (34 + 5 * a * s / max(h, 1))
    if precision == "fp32":
        per_layer *= 2
    act = L * (2 * s * micro_batch * h if grad_checkpointing else per_layer)
    return dict(weights=weights, grads=grads, optimizer=optimizer, states=states, activations=act, total=states + act)
