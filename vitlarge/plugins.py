"""The Colossal-AI Booster plugin a recipe asks for, on the device ``launch.choose_device`` chose.

``ddp`` (TorchDDPPlugin) runs anywhere, CPU included. ``zero`` (LowLevelZeroPlugin, stage 1:
optimizer states sharded over the data-parallel ranks) needs CUDA; it is for models whose LAMB
states do not fit next to the weights (ViT-H/14 and up). Its fp16/bf16 handling and clipping live
inside the plugin, so the engine's own scaler is disabled for it (fp32 here means "let ZeRO cast").

Device: both plugins move the model to Colossal-AI's "current device" (``colossalai.utils.
get_current_device()``, i.e. its global accelerator, which it detects as CUDA whenever CUDA is
available). ``build_plugin`` sets that accelerator from our device, so ``train.device=cpu`` on a
CUDA host keeps the model on the CPU, next to its data, autocast and gloo.
"""

from __future__ import annotations

from vitlarge.config import Config
from vitlarge.errors import UserError

DDP_BUCKET_CAP_MB = 25
"""DDP's gradient bucket size: ViT-B/16's 86M fp32 gradients go out in ~14 all-reduces."""


def build_plugin(cfg: Config, device):
    """The plugin for ``cfg.train.plugin``; ``device`` (a ``torch.device``) becomes Colossal-AI's current device.

    For CUDA, the index is the one ``launch.choose_device`` made current with ``torch.cuda.set_device``."""
    import torch
    from colossalai.accelerator import set_accelerator

    set_accelerator(torch.device(device).type)
    if cfg.train.plugin == "ddp":
        from colossalai.booster.plugin import TorchDDPPlugin

        # One bucket per ~25 MB: ViT-B/16's 86M fp32 gradients go out in ~14 all-reduces, overlapped
        # with the last micro-step's backward; earlier micro-steps run under no_sync.
        return TorchDDPPlugin(bucket_cap_mb=DDP_BUCKET_CAP_MB, broadcast_buffers=False)
    if torch.device(device).type != "cuda":
        raise UserError("train.plugin=zero needs CUDA (Colossal-AI's ZeRO kernels); use train.plugin=ddp on CPU")
    from colossalai.booster.plugin import LowLevelZeroPlugin

    return LowLevelZeroPlugin(stage=1, precision=cfg.train.precision, max_norm=cfg.optim.clip_grad_norm,
                              initial_scale=cfg.train.init_loss_scale)
