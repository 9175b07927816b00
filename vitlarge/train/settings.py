"""What a run resolves once for its device, in one frozen object; the validated config is never rewritten.

``train.precision: auto`` and ``train.compile: auto`` depend on the device; the device, its backend and
the thread counts depend on the launcher and the machine. `resolve_settings` decides all of them at start, with
the reason for each, and `Settings.config` gives the copy of the recipe's config that the run's parts
read (its ``auto`` values replaced). The recipe's own object is left as the user wrote it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from vitlarge.config.schema import Config
from vitlarge.model.precision import choose_precision, cpu_fp16_warning


@dataclass(frozen=True)
class Settings:
    device: torch.device
    backend: str
    """The process group's: ``nccl`` on CUDA, ``gloo`` on CPU ("" before one is chosen)."""
    precision: str
    precision_why: str
    """The line the run logs about its precision: ``auto``'s choice and why, or fp16's warning on a slow CPU."""
    compile: bool
    compile_why: str
    fsdp_reduce_every_micro_step: bool
    """``train.fsdp_accumulation`` resolved (vitlarge/train/engine.py, `fsdp_reduce_every_micro_step`)."""
    threads: int
    threads_why: str

    def config(self, cfg: Config) -> Config:
        """A copy of ``cfg`` with the resolved precision and compile setting in place of ``auto``."""
        c = copy.deepcopy(cfg)
        c.train.precision = self.precision
        c.train.compile = "on" if self.compile else "off"
        return c

    def lines(self) -> list[str]:
        """What the run logs about its choices: auto values, and a recipe's fp16 on a CPU that emulates it."""
        out = [f"threads: {self.threads} per process ({self.threads_why})"] if self.threads else []
        return out + [self.precision_why] if self.precision_why else out


def compile_choice(requested: str, device: torch.device) -> tuple[bool, str]:
    """``train.compile``: ``on``/``off`` as given; ``auto`` is on with CUDA, off on CPU.

    CPU is off because there it does not pay: on 2 cores of an AMD EPYC (AVX2, shared) a compiled
    ViT-S/16 step took 1.25x the eager one and compiling it took minutes (docs/PERFORMANCE.md, section 10).
    On CUDA Inductor fuses the norms, GELUs, residual adds and casts between the matmuls into a few
    kernels, which is where a ViT step spends its non-matmul time."""
    if requested != "auto":
        return requested == "on", f"compile {requested}: set by the recipe"
    if device.type == "cuda":
        return True, "compile auto -> on: CUDA: Inductor fuses the elementwise work between the matmuls"
    return False, (
        "compile auto -> off: CPU: measured slower than eager (ViT-S/16: 0.8x), and compiling takes minutes "
        "(docs/PERFORMANCE.md)"
    )


DETERMINISTIC_CUBLAS = ":4096:8"  # 8 cuBLAS workspaces of 4 MiB per stream: what torch's reproducibility notes ask


def apply_determinism(on: bool, device: torch.device | str) -> str:
    """``train.deterministic``, process-wide, before the first CUDA kernel; returns the line a CUDA run logs
    ("" on CPU, where vitlarge's kernels are deterministic whatever the flags).

    On: ``torch.use_deterministic_algorithms(True)`` (not ``warn_only``, which warns and keeps the
    nondeterministic kernel: memory-efficient attention keeps splitting its keys), cuDNN deterministic and
    not benchmarking, ``CUBLAS_WORKSPACE_CONFIG`` (kept if the user set it; cuBLAS reads it when its first
    handle is made, so this must come first), and ``fill_uninitialized_memory`` off (on by default in
    deterministic mode: it writes NaN into every new tensor, a cost for no gain in a program that reads
    none uninitialised). Off: torch's defaults."""
    import os

    torch.use_deterministic_algorithms(on)
    torch.utils.deterministic.fill_uninitialized_memory = not on
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False
    if on and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):  # the two torch accepts
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = DETERMINISTIC_CUBLAS
    if torch.device(device).type != "cuda":
        return ""
    if not on:
        return "deterministic: off (train.deterministic=false): a resumed run is close to, not bitwise, the uninterrupted one"
    return (
        "deterministic: on (torch deterministic algorithms, cuDNN deterministic, "
        f"CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']}): resumes at the same world size are bitwise"
    )


NONDETERMINISTIC = "does not have a deterministic implementation"  # torch's words when an op has no such kernel


def explain_nondeterministic(e: RuntimeError) -> str | None:
    """The one line for a ``RuntimeError`` raised by deterministic mode (None for any other error)."""
    text = str(e)
    if NONDETERMINISTIC not in text:
        return None
    op = text.split(NONDETERMINISTIC)[0].strip().rstrip(",")
    return (
        f"{op} has no deterministic kernel on this device, and train.deterministic is on; set "
        "train.deterministic=false to train with it (resumes are then close to, not bitwise, the uninterrupted run)"
    )


def resolve_settings(
    cfg: Config, device: torch.device | str, backend: str = "", threads: tuple[int, str] = (0, "")
) -> Settings:
    """Every device-dependent setting of ``cfg`` on ``device``, decided once."""
    from vitlarge.train.engine import fsdp_reduce_every_micro_step

    device = torch.device(device)
    precision, why = choose_precision(cfg.train.precision, device)
    compile_on, compile_why = compile_choice(cfg.train.compile, device)
    return Settings(
        device=device,
        backend=backend,
        precision=precision,
        precision_why=f"precision auto -> {precision}: {why}"
        if cfg.train.precision == "auto"
        else cpu_fp16_warning(precision, device),
        compile=compile_on,
        compile_why=compile_why,
        fsdp_reduce_every_micro_step=fsdp_reduce_every_micro_step(cfg.train.fsdp_accumulation, precision),
        threads=threads[0],
        threads_why=threads[1],
    )
