"""Mixed precision on any device: autocast plus, for fp16, dynamic loss scaling.

We do not use Booster's ``mixed_precision='fp16'``: it builds CUDA's GradScaler (so it fails on a
CPU-only host) and wraps the model a second time. ``torch.autocast(device_type, dtype)`` with
``torch.amp.GradScaler(device_type)`` behaves the same on CPU and GPU, so one code path is tested
here and runs on GPUs.

``train.precision=auto`` is resolved once, at start, by `choose_precision`: the fastest precision the device
trains in. Without it a recipe written for GPUs (fp16) runs 10x slower on a CPU that has no fp16
vector unit (an AMD EPYC: fp16 matmul ~1 GFLOP/s against ~60 for fp32, measured).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, NamedTuple

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def cpu_flags() -> frozenset[str]:
    """This CPU's instruction-set flags from ``/proc/cpuinfo`` (empty where there is none, e.g. macOS)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


class PrecisionChoice(NamedTuple):
    """`choose_precision`'s answer: the precision and why (the run logs it for ``auto``)."""

    name: str
    why: str


def choose_precision(name: str, device: torch.device, flags: frozenset[str] | None = None) -> PrecisionChoice:
    """The precision and why: ``name`` itself unless it is ``auto``, which picks by device.

    * CUDA: ``bf16`` where the GPU has bf16 tensor cores (compute capability 8.0 and newer: no loss
      scaling needed), else ``fp16`` (with `Precision`'s GradScaler).
    * CPU: ``fp16`` with AVX512-FP16 or AMX-FP16, ``bf16`` with AMX-BF16, else ``fp32``. Without
      matrix units autocast only adds casts: on an Intel Xeon with AVX512-FP16 fp16 ran 1.1x fp32
      (docs/PERFORMANCE.md §6); on an AMD EPYC without it a demo micro-step took 308 ms in fp16,
      47 ms in bf16 (AVX512-BF16) and 31 ms in fp32.
    """
    if name != "auto":
        return PrecisionChoice(name, "set by the recipe")
    if device.type == "cuda":
        # Compute capability 8.0 (Ampere) is where bf16 tensor cores start; pre-Ampere GPUs (V100 7.0,
        # T4 7.5) run bf16 only emulated. The same test as torch.cuda.is_bf16_supported(including_emulation=False).
        major, minor = torch.cuda.get_device_capability(device)
        gpu = f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
        if (major, minor) >= (8, 0):
            return PrecisionChoice("bf16", f"{gpu} has bf16 tensor cores: no loss scaling")
        return PrecisionChoice(
            "fp16", f"{gpu} has no bf16 tensor cores (8.0 and newer): fp16 with dynamic loss scaling"
        )
    flags = cpu_flags() if flags is None else flags
    if flags & FAST_FP16:
        return PrecisionChoice("fp16", "this CPU has fast fp16 (AVX512-FP16/AMX-FP16)")
    if "amx_bf16" in flags:
        return PrecisionChoice("bf16", "this CPU has AMX-BF16")
    return PrecisionChoice("fp32", "this CPU has no fp16/bf16 matrix unit, where autocast only adds casts")


FAST_FP16 = frozenset({"avx512_fp16", "amx_fp16"})
"""The CPU flags under which fp16 trains at fp32's speed or better (`choose_precision`)."""


def cpu_fp16_warning(name: str, device: torch.device, flags: frozenset[str] | None = None) -> str:
    """The line a run prints when the recipe (or an override) asks for ``fp16`` on a CPU that emulates it: a
    GPU recipe such as vit_b16.py then trains 5-10x slower than ``auto`` gives (6-12 against 49-64 img/s on
    an AMD EPYC); "" otherwise."""
    if name != "fp16" or device.type != "cpu":
        return ""
    flags = cpu_flags() if flags is None else flags
    if flags & FAST_FP16:
        return ""
    auto = choose_precision("auto", device, flags)[0]
    return (
        "warning: train.precision=fp16 on a CPU without AVX512-FP16/AMX-FP16 trains about 5-10x slower than "
        f"fp32 here; set train.precision=auto ({auto} on this CPU) or train.precision=fp32/bf16"
    )


class Precision:
    """Owns autocast and the loss scaler for one run; ``scaler`` is disabled unless fp16.

    ``sharded`` (``train.plugin=fsdp``): FSDP2 casts parameters itself (`vitlarge.distributed.fsdp`), so there is no
    autocast. The scaler is ``torch.amp.GradScaler`` there too: the gradients are DTensors, and DTensor's
    handler for the unscale kernel (``_amp_foreach_non_finite_check_and_unscale_``) reduces ``found_inf``
    with a max over the mesh, so one rank's inf skips the step and lowers the scale on every rank.
    (torch's ``ShardedGradScaler`` would all-reduce it a second time and, on DTensor gradients in torch
    2.10, warns about its non-scalar ``found_inf``.)"""

    def __init__(
        self,
        name: str,
        device: torch.device,
        init_scale: float = 2.0**16,
        growth_interval: int = 2000,
        sharded: bool = False,
    ):
        if name not in DTYPES:
            raise ValueError(
                f"precision {name!r} is not resolved; call vitlarge.model.precision.choose_precision first"
            )
        self.name = name
        self.device_type = device.type
        self.dtype = DTYPES[name]
        self.sharded = sharded
        self.scaler = torch.amp.GradScaler(
            self.device_type, init_scale=init_scale, growth_interval=growth_interval, enabled=name == "fp16"
        )

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.name == "fp32" or self.sharded:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    @property
    def loss_scale(self) -> float:
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0
