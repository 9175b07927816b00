"""The Colossal-AI Booster plugin a recipe asks for.

``ddp`` (TorchDDPPlugin) runs anywhere, CPU included. ``zero`` (LowLevelZeroPlugin, stage 1:
optimizer states sharded over the data-parallel ranks) needs CUDA; it is for models whose LAMB
states do not fit next to the weights (ViT-H/14 and up). Its fp16/bf16 handling and clipping live
inside the plugin, so the engine's own scaler is disabled for it (fp32 here means "let ZeRO cast").
"""

from __future__ import annotations

from vitlarge.config import Config
from vitlarge.errors import UserError


def build_plugin(cfg: Config):
    import torch

    if cfg.train.plugin == "ddp":
        from colossalai.booster.plugin import TorchDDPPlugin

        # One bucket per ~25 MB: ViT-B/16's 86M fp32 gradients go out in ~14 all-reduces, overlapped
        # with the last micro-step's backward; earlier micro-steps run under no_sync.
        return TorchDDPPlugin(bucket_cap_mb=25, broadcast_buffers=False)
    if not torch.cuda.is_available():
        raise UserError("train.plugin=zero needs CUDA (Colossal-AI's ZeRO kernels); use train.plugin=ddp on CPU")
    from colossalai.booster.plugin import LowLevelZeroPlugin

    return LowLevelZeroPlugin(stage=1, precision=cfg.train.precision, max_norm=cfg.optim.clip_grad_norm,
                              initial_scale=cfg.train.init_loss_scale)
