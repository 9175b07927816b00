"""The attention kernel a run trains with, chosen once when the model is built and logged with the run's settings.

timm's ViT attention calls ``F.scaled_dot_product_attention`` (SDPA) when ``fused_attn`` is on
(`vitlarge.model.vit.build_model`: ``model.fused_attn``). On CUDA, SDPA picks a backend per call among FlashAttention,
memory-efficient (xFormers/CUTLASS), cuDNN and the math fallback, by torch's priority order and each backend's
constraints (dtype, head dimension, dropout, GPU). Every attention call of a ViT has the same shapes, so the answer
is known before the first step: `choose_attention` asks torch's own checks (``torch.backends.cuda.can_use_*``) in
torch's priority order, for the model's heads, tokens and head dimension, the run's precision and its attention
dropout, then leaves only that backend enabled (with the math path as torch's fallback) so the run takes it on
every call whatever a later torch reorders, and says which in one line. On the CPU torch picks its CPU kernel per
call; the line says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPAParams, SDPBackend

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class AttentionChoice:
    backend: str
    """``flash``, ``efficient``, ``cudnn``, ``math`` (CUDA SDPA), ``cpu`` (SDPA on the CPU) or ``unfused``."""
    line: str
    """What the run logs."""


def attention_shape(model: torch.nn.Module) -> tuple[int, int, int] | None:
    """``(heads, tokens, head dim)`` of the model's first attention block, None for a model without one."""
    blocks: Any = getattr(model, "blocks", None)
    if not blocks:
        return None
    attn = blocks[0].attn
    heads = int(attn.num_heads)
    head_dim = int(getattr(attn, "head_dim", 0) or attn.qkv.out_features // 3 // heads)
    embed: Any = getattr(model, "patch_embed", None)
    tokens = int(embed.num_patches) + int(getattr(model, "num_prefix_tokens", 1)) if embed is not None else 0
    return heads, tokens, head_dim


def _backends() -> dict[str, tuple[Any, Any]]:
    cuda = torch.backends.cuda
    return {
        "flash": (SDPBackend.FLASH_ATTENTION, cuda.can_use_flash_attention),
        "efficient": (SDPBackend.EFFICIENT_ATTENTION, cuda.can_use_efficient_attention),
        "cudnn": (SDPBackend.CUDNN_ATTENTION, cuda.can_use_cudnn_attention),
    }


def _enable(only: str | None) -> None:
    """The fused CUDA backends: all enabled (``only`` None) or only ``only``; the math path stays enabled."""
    cuda = torch.backends.cuda
    cuda.enable_flash_sdp(only in (None, "flash"))
    cuda.enable_mem_efficient_sdp(only in (None, "efficient"))
    cuda.enable_cudnn_sdp(only in (None, "cudnn"))


def choose_attention(model: torch.nn.Module, device: torch.device, precision: str, dropout: float) -> AttentionChoice:
    """The backend ``model``'s attention takes on ``device`` in ``precision`` with attention dropout ``dropout``
    (while training); on CUDA it is then the only fused backend enabled in this process."""
    shape = attention_shape(model)
    blocks: Any = getattr(model, "blocks", None)
    fused = bool(shape) and bool(getattr(blocks[0].attn, "fused_attn", False))
    if shape is None:
        return AttentionChoice("unfused", "attention: the model has no ViT attention blocks")
    heads, tokens, head_dim = shape
    what = f"{heads} heads x {tokens} tokens x {head_dim} dims, {precision}, dropout {dropout:g}"
    if not fused:
        return AttentionChoice("unfused", f"attention: unfused (timm's matmul and softmax; model.fused_attn): {what}")
    if device.type != "cuda":
        return AttentionChoice("cpu", f"attention: SDPA on the CPU, torch picks its CPU kernel per call: {what}")

    _enable(None)  # a backend another model in this process pinned is a candidate again
    q, k, v = (
        torch.empty(1, heads, tokens, head_dim, device=device, dtype=DTYPES[precision], requires_grad=True)
        for _ in range(3)
    )
    params = SDPAParams(q, k, v, None, dropout, False, False)
    order = {b.value: name for name, (b, _) in _backends().items()}
    chosen, refused = "math", []
    for b in torch._C._get_sdp_priority_order():
        name = order.get(b)
        if name is None:  # math (the fallback) or a backend vitlarge does not name
            if b == torch.nn.attention.SDPBackend.MATH.value:
                break
            continue
        try:
            usable = bool(_backends()[name][1](params))
        except RuntimeError:  # a backend this torch or driver cannot query counts as refused
            usable = False
        if usable:
            chosen = name
            break
        refused.append(name)
    _enable(chosen if chosen != "math" else None)
    why = f" ({', '.join(refused)} refused these shapes)" if refused else ""
    return AttentionChoice(chosen, f"attention: SDPA {chosen}, chosen once for {what}{why}")
