"""Mixed precision on any device: autocast plus, for fp16, dynamic loss scaling.

We do not use Booster's ``mixed_precision='fp16'``: it builds CUDA's GradScaler (so it fails on a
CPU-only host) and wraps the model a second time. ``torch.autocast(device_type, dtype)`` with
``torch.amp.GradScaler(device_type)`` behaves the same on CPU and GPU, so one code path is tested
here and runs on GPUs.
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class Precision:
    """Owns autocast and the loss scaler for one run; ``scaler`` is disabled unless fp16."""

    def __init__(self, name: str, device: torch.device, init_scale: float = 2.0**16, growth_interval: int = 2000):
        self.name = name
        self.device_type = device.type
        self.dtype = DTYPES[name]
        self.scaler = torch.amp.GradScaler(
            self.device_type, init_scale=init_scale, growth_interval=growth_interval, enabled=name == "fp16"
        )

    def autocast(self):
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    @property
    def loss_scale(self) -> float:
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0
