"""The device side of the GPU kit (benchmarks/gpu/): device choice, datasheet peaks (and the MFU against them),
memory, out-of-memory.

Contract: every function takes the ``torch.device`` the kit runs on and behaves the same on CPU and
CUDA, except where CUDA has something the CPU has not (timing on either is
`benchmarks.harness.timing.device_seconds`): peak memory is ``torch.cuda.max_memory_allocated`` and None on the CPU (no allocator statistics).
Nothing here imports Colossal-AI, DALI or TFRecord.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable

import torch

# Dense (no 2:4 sparsity) bf16 = fp16 tensor-core peak from NVIDIA's datasheets, in TFLOP/s, and the
# streaming multiprocessors of the whole chip. Matched against torch.cuda.get_device_name's words
# (split at spaces and dashes, upper case) in order: the first entry whose words all occur wins, so
# the PCIe and NVL variants come before the SXM default of their chip.
DATASHEET_TFLOPS = (
    (("GH200",), "GH200 (Hopper GPU)", 989.4, 132),  # its own word: not "H200"
    (("H100", "PCIE"), "H100 PCIe", 756.0, 114),
    (("H100", "NVL"), "H100 NVL", 835.0, 132),
    (("H100",), "H100 SXM", 989.4, 132),  # "NVIDIA H100 80GB HBM3" is the SXM5 board
    (("H200", "NVL"), "H200 NVL", 835.0, 132),
    (("H200",), "H200 SXM", 989.4, 132),
    (("A100",), "A100 (SXM4 and PCIe)", 312.0, 108),
)


def resolve_device(spec: str, current_index: int | None = None) -> torch.device:
    """``spec`` (``cuda``, ``cuda:N``, ``cpu``) with the CUDA index filled in.

    ``torch.cuda.set_device`` and the per-device statistics need an index: a bare ``cuda`` becomes
    ``cuda:<current_index>`` (default: ``torch.cuda.current_device()``, which initialises CUDA, so
    callers check ``torch.cuda.is_available()`` first). Raises ValueError for other device types and
    RuntimeError (torch's) for a malformed ``spec``."""
    device = torch.device(spec)
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"device type {device.type!r}: use cuda, cuda:N or cpu")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device() if current_index is None else current_index)
    return device


def datasheet_peak(name: str, multiprocessors: int | None = None) -> dict | None:
    """``{"board", "dense_bf16_fp16_flops", "sm_fraction"}`` for an H100/H200/GH200/A100 ``name``, else None.

    A MIG slice (``MIG`` among the words, e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb") has only part
    of the chip's multiprocessors: its peak is the chip's scaled by ``multiprocessors`` / the chip's
    (what ``get_device_properties`` reports for the slice), or None when that count is not given."""
    words = set(re.split(r"[\s\-_]+", name.upper()))
    for need, board, tflops, chip_sms in DATASHEET_TFLOPS:
        if all(w in words for w in need):
            fraction = 1.0
            if "MIG" in words:
                if not multiprocessors:
                    return None
                fraction = min(1.0, multiprocessors / chip_sms)
                board = f"{board}, MIG slice {multiprocessors}/{chip_sms} SMs"
            return {
                "board": board,
                "dense_bf16_fp16_flops": tflops * 1e12 * fraction,
                "sm_fraction": round(fraction, 4),
            }
    return None


def mfu(flops_per_s: float, peak: dict, dtype: str) -> dict:
    """The model FLOP utilization of ``flops_per_s`` against the kit's peaks (``peak``: its matmul section): the
    measured ``dtype`` matmul's and the datasheet's (None off the datasheet)."""
    sheet = peak["datasheet"]
    return {
        "vs_measured_matmul": round(flops_per_s / peak["measured"][dtype]["flops_per_s"], 4),
        "vs_datasheet": round(flops_per_s / sheet["dense_bf16_fp16_flops"], 4) if sheet else None,
    }


def device_info(device: torch.device) -> dict:
    """What the numbers were taken on: the GPU's name, memory and capability, or the CPU's model."""
    from benchmarks.harness.results import cpu_model

    info = {"type": device.type, "torch": torch.__version__}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(
            name=p.name,
            memory_bytes=p.total_memory,
            capability=f"{p.major}.{p.minor}",
            multiprocessors=p.multi_processor_count,
            cuda=torch.version.cuda,
        )
    else:
        info.update(name=cpu_model(), threads=torch.get_num_threads())
    return info


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allocated(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_since_reset(device: torch.device, baseline: int | None = 0) -> int | None:
    """Peak bytes allocated since `reset_peak`, less ``baseline`` (what others held); None on CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) - (baseline or 0)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def fits(fn: Callable[[], object], device: torch.device) -> bool:
    """True if ``fn()`` ran, False if it ran out of device memory (other errors propagate).

    The exception is dropped before memory is freed: its traceback holds the frames, and with them
    the activations, that made it fail."""
    ok = True
    try:
        fn()
    except torch.cuda.OutOfMemoryError:
        ok = False
    if not ok:
        free_memory(device)
    return ok
