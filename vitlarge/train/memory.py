"""GPU memory a first run can trust: the caching allocator's setting, each rank's free memory at start, and
the peaks every step reports (allocated and reserved).

No module-level torch import: `configure_allocator` runs before torch loads (`vitlarge.run.cli.main`).
"""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ALLOC_CONF = "expandable_segments:True"
"""vitlarge's allocator setting. Progressive phases change every activation's shape; with fixed segments the
caching allocator keeps the old shapes' blocks and cudaMallocs new ones, so reserved memory grows past what is
allocated (fragmentation) until an out-of-memory error with memory free. Expandable segments grow one mapping
instead (PyTorch's CUDA semantics notes, "expandable_segments")."""

ALLOC_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""Where torch reads the allocator's setting: ``PYTORCH_ALLOC_CONF`` (torch 2.9 and newer,
c10/core/AllocatorConfig.cpp) and ``PYTORCH_CUDA_ALLOC_CONF`` (the older name, still read). Seen on an NVIDIA
H200 with torch 2.11.0+cu130: either alone takes effect; with both set, ``PYTORCH_CUDA_ALLOC_CONF`` wins
(``PYTORCH_ALLOC_CONF=expandable_segments:False`` beside ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
gave expandable segments). So a user's setting under either name is left alone, and ours never sits beside it."""


def configure_allocator(environ: MutableMapping[str, str] = os.environ) -> str:
    """Sets ``PYTORCH_CUDA_ALLOC_CONF`` to `ALLOC_CONF` unless the user set either of `ALLOC_VARS` (then both
    are left alone); returns the setting in force as the start line says it. Must run before the CUDA
    allocator first reads its setting: before torch is imported, and so it is inherited by what the process
    starts. The older name, which every torch reads, is the one set."""
    for var in ALLOC_VARS:
        if environ.get(var):
            return f"{var}={environ[var]} (yours)"
    environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF
    return f"PYTORCH_CUDA_ALLOC_CONF={ALLOC_CONF} (vitlarge's; set PYTORCH_ALLOC_CONF to choose another)"


def gpu_start_line(device: torch.device, rank: int, environ: MutableMapping[str, str] = os.environ) -> str:
    """The line each rank says at start on CUDA ("" elsewhere): its GPU, the free and total memory the driver
    reports (free well below total: another process holds this GPU), and the allocator setting."""
    import torch  # lazy: keeps torch off train.py until the thread pools are sized

    if device.type != "cuda":
        return ""
    free, total = torch.cuda.mem_get_info(device)
    allocator = next((f"{v}={environ[v]}" for v in ALLOC_VARS if environ.get(v)), "allocator defaults")
    return (
        f"rank {rank} on {socket.gethostname()} {device} ({torch.cuda.get_device_name(device)}): GPU memory "
        f"{_gib(free)} free of {_gib(total)}; {allocator}"
    )


def peak_memory(device: torch.device) -> tuple[int, int | None]:
    """``(allocated, reserved)`` peak bytes of this process: CUDA's max allocated and max reserved (the caching
    allocator's segments: what the GPU holds for tensors, fragmentation included); on CPU the max RSS and
    None (a CPU has no such split)."""
    import torch  # lazy: keeps torch off train.py until the thread pools are sized

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, None  # Linux reports KiB


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
