"""What a run resolves once for its device, in one frozen object; the validated config is never rewritten.

``train.precision: auto`` and ``train.compile: auto`` depend on the device; the device, its backend and
the thread counts depend on the launcher and the machine. `resolve_settings` decides all of them at start, with
the reason for each, and the parts that depend on them take the `Settings` (or the one value of it they need):
the config stays as the user wrote it, and nothing reads a device-dependent choice from it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from typing import NamedTuple

import torch

from vitlarge.config.schema import Config
from vitlarge.distributed.threads import NO_THREADS, ThreadPools
from vitlarge.errors import UserError
from vitlarge.model.precision import PrecisionChoice, choose_precision, cpu_fp16_warning


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
    """The line `vitlarge.train.assemble.build` logs: whether the model is compiled, why, and (when it is) what
    ``train.compile_scope`` compiles."""
    compile_scope: str
    """``model`` or ``blocks`` (`compile_scope_choice`); read only when ``compile`` is on."""
    lamb_implementation: str
    """``optim.implementation`` resolved for the device: ``chunked``, ``foreach`` or ``compiled``
    (`lamb_implementation`)."""
    fsdp_reduce_every_micro_step: bool
    """``train.fsdp_accumulation`` resolved with the precision (`fsdp_reduce_every_micro_step`): what the engine
    and the dry run's memory estimate read."""
    threads: int
    threads_why: str

    def lines(self) -> list[str]:
        """What the run logs about its choices: auto values, and a recipe's fp16 on a CPU that emulates it."""
        out = [f"threads: {self.threads} per process ({self.threads_why})"] if self.threads else []
        return out + [self.precision_why] if self.precision_why else out


class CompileChoice(NamedTuple):
    """`compile_choice`'s answer: whether the forward is compiled, and why (the line `build` logs)."""

    on: bool
    why: str


def compile_choice(requested: str, device: torch.device, check_toolchain: bool = True) -> CompileChoice:
    """``train.compile``: ``on``/``off`` as given; ``auto`` is on with CUDA, off on CPU.

    CPU is off because there it does not pay: on 2 cores of an AMD EPYC (AVX2, shared) a compiled
    ViT-S/16 step took 1.25x the eager one and compiling it took minutes (docs/PERFORMANCE.md, section 10).
    On CUDA Inductor fuses the norms, GELUs, residual adds and casts between the matmuls into a few
    kernels, which is where a ViT step spends its non-matmul time.

    Whenever compile would be on, Inductor's toolchain is checked first (`missing_toolchain`): what is
    missing stops ``on`` with one line (a `UserError`, exit 2) and turns ``auto`` to eager with the reason in
    its line, instead of a traceback from inside Inductor at step 1. It is raised before the process group
    exists: a rank whose node alone lacks it names itself and stops the others
    (`vitlarge.distributed.process.report_before_group`). ``check_toolchain=False``: the choice without that
    check (``--dry-run``, which compiles nothing and may plan for another machine)."""
    if requested == "off":
        return CompileChoice(False, "compile off: set by the recipe")
    if requested == "auto" and device.type != "cuda":
        return CompileChoice(
            False,
            (
                "compile auto -> off: CPU: measured slower than eager (ViT-S/16: 0.8x), and compiling takes minutes "
                "(train.compile in vitlarge-train --help)"
            ),
        )
    missing = missing_toolchain(device) if check_toolchain else ""
    if missing and requested == "on":
        raise UserError(f"train.compile=on, but {missing}, or set train.compile=off to train eager")
    if missing:
        return CompileChoice(False, f"compile auto -> off: {missing}, so eager")
    if requested == "on":
        return CompileChoice(True, "compile on: set by the recipe")
    return CompileChoice(True, "compile auto -> on: CUDA: Inductor fuses the elementwise work between the matmuls")


class CompileScope(NamedTuple):
    """`compile_scope_choice`'s answer: ``model`` or ``blocks``, and why (appended to the compile line)."""

    scope: str
    why: str


def compile_scope_choice(requested: str, plugin: str) -> CompileScope:
    """``train.compile_scope``: ``model``/``blocks`` as given; ``auto`` is ``blocks`` under fsdp, ``model`` under ddp.

    Under fsdp a whole-model graph breaks at every block (FSDP2 runs each block's all-gather and reshard hooks
    outside Dynamo), so each block compiled on its own before ``fully_shard`` is strictly better. Under ddp
    the whole model is the form measured on a GPU (docs/PERFORMANCE.md section 8); compiling per block keeps
    DDP's buckets overlapping the backward but leaves the edges eager: which is faster is for the GPU kit to
    measure, with ``train.compile_scope=blocks``."""
    if requested == "blocks":
        return CompileScope("blocks", "each transformer block compiled on its own (train.compile_scope=blocks)")
    if requested == "model":
        return CompileScope("model", "the whole model as one graph (train.compile_scope=model)")
    if plugin == "fsdp":
        return CompileScope(
            "blocks",
            "each transformer block compiled on its own (train.compile_scope auto: fsdp, whose per-block hooks "
            "would break a whole-model graph at every block)",
        )
    return CompileScope("model", "the whole model as one graph (train.compile_scope auto: ddp)")


def lamb_implementation(requested: str, device: torch.device, check_toolchain: bool = True) -> str:
    """``optim.implementation``: ``chunked``/``foreach``/``compiled`` as given; ``auto`` is ``chunked`` on CPU,
    where a 4M-element chunk stays in the cache between the ops of a step (ViT-B/16's step: 376 CPU-ms against
    690 over whole tensors, medians of 9 interleaved steps on 2 shared cores of an AMD EPYC), and ``foreach`` on
    CUDA, where each chunk costs a launch per op and one launch per op over all parameters is the same arithmetic,
    bit for bit. ``compiled`` needs Inductor's toolchain, checked as for ``train.compile=on``
    (`missing_toolchain`)."""
    if requested == "auto":
        return "foreach" if device.type == "cuda" else "chunked"
    if requested == "compiled" and check_toolchain:
        missing = missing_toolchain(device)
        if missing:
            raise UserError(f"optim.implementation=compiled, but {missing}, or set optim.implementation=auto")
    return requested


def missing_toolchain(device: torch.device) -> str:
    """What torch.compile's Inductor needs on ``device`` and this machine lacks, with the fix ("" if nothing).

    Checked as torch 2.10 and Triton 3.x look them up, without compiling anything:

    * CPU: the C++ compiler of Inductor's CPU kernels, ``torch._inductor.config.cpp.cxx``: ``CXX`` or ``g++``
      on PATH (``torch/_inductor/cpp_builder.py`` ``cpp_compiler_search``; its conda download only runs
      under ``TORCH_INDUCTOR_INSTALL_GXX``).
    * CUDA: ``triton`` importable; the C compiler Triton builds its launcher with (``triton/runtime/build.py``:
      ``CC``, else ``gcc`` or ``clang`` on PATH); ``libcuda.so.1`` as Triton finds it (``TRITON_LIBCUDA_PATH``,
      else ``ldconfig -p``, else ``LD_LIBRARY_PATH``: its own ``libcuda_dirs``, run uncached). Not checked:
      that the driver's libcuda loads, or ptxas (Triton ships its own).
    * Both: ``Python.h`` in the include folder both use (sysconfig's, Debian's ``posix_local`` read as
      ``posix_prefix`` as Triton does).
    """
    if device.type == "cuda":
        try:
            import triton  # noqa: F401  # lazy: keeps triton off CPU runs (a CPU-only torch has none)
        except ImportError as e:
            return (
                f"triton is not importable (Inductor's GPU kernels): {e}; install the triton that torch "
                f"{torch.__version__} names (pip install torch's own requirements)"
            )
        cc = os.environ.get("CC")
        if cc and not shutil.which(cc):
            return f"{cc} (Triton's C compiler, from CC) is not on PATH: install it or unset CC"
        if not cc and not (shutil.which("gcc") or shutil.which("clang")):
            return (
                "no C compiler for Triton (CC unset, neither gcc nor clang on PATH): install gcc "
                "(Debian/Ubuntu: apt install build-essential; RHEL: dnf install gcc)"
            )
        if not _libcuda_found():
            return (
                "Triton finds no libcuda.so.1 (not in `ldconfig -p` nor LD_LIBRARY_PATH): set TRITON_LIBCUDA_PATH "
                "to the folder of the driver's libcuda.so.1"
            )
    else:
        cxx = os.environ.get("CXX")  # torch/_inductor/config.py: cpp.cxx = (None, CXX or "g++")
        if not shutil.which(cxx or "g++"):
            said = (
                f"{cxx} (Inductor's C++ compiler, from CXX)"
                if cxx
                else "g++ (Inductor's C++ compiler; set CXX for another)"
            )
            return (
                f"{said} is not on PATH: install it (Debian/Ubuntu: apt install build-essential; RHEL: dnf install "
                "gcc-c++)"
            )
    include = python_include()
    if not os.path.isfile(os.path.join(include, "Python.h")):
        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        return (
            f"the Python headers are missing ({include}/Python.h, which Inductor's kernels include): install them "
            f"(Debian/Ubuntu: apt install python{py}-dev; RHEL: dnf install python{py}-devel)"
        )
    return ""


def python_include() -> str:
    """The folder holding Python.h as Triton's build reads it (Inductor adds the same folder)."""
    scheme = sysconfig.get_default_scheme()
    return sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]


def _libcuda_found() -> bool:
    """Triton's own lookup of libcuda.so.1, uncached (its cache would keep a test's or a first answer)."""
    try:
        from triton.backends.nvidia import driver  # lazy: keeps triton off CPU runs (a CPU-only torch has none)

        getattr(driver.libcuda_dirs, "__wrapped__", driver.libcuda_dirs)()
    except (ImportError, AssertionError, OSError, subprocess.SubprocessError):
        return False
    return True


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
    torch.use_deterministic_algorithms(on)
    # a module property that torch's stubs do not declare
    torch.utils.deterministic.fill_uninitialized_memory = not on  # pyright: ignore[reportAttributeAccessIssue]
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


def fsdp_reduce_every_micro_step(mode: str, precision: str) -> bool:
    """``train.fsdp_accumulation`` resolved: ``reduce_scatter`` reduces every micro-step into this rank's fp32
    gradient shard; ``no_sync`` keeps the unsharded gradient between micro-steps (FSDP2 accumulates it in
    ``reduce_dtype``, fp32, also under bf16/fp16: the whole fp32 gradient on every rank) and reduces once per
    optimizer step. ``auto``: ``reduce_scatter`` under bf16/fp16 (the large recipes, where the unsharded fp32
    gradient is what does not fit), ``no_sync`` under fp32 (``precision`` resolved first). Read by the engine (vitlarge/train/engine.py) from `Settings`."""
    return mode == "reduce_scatter" or (mode == "auto" and precision != "fp32")


def resolve_settings(
    cfg: Config, device: torch.device | str, backend: str = "", threads: ThreadPools = NO_THREADS
) -> Settings:
    """Every device-dependent setting of ``cfg`` on ``device``, decided once."""
    device = torch.device(device)
    precision = choose_precision(cfg.train.precision, device)
    lamb = lamb_implementation(cfg.optim.implementation, device)
    return _settings(cfg, device, backend, precision, compile_choice(cfg.train.compile, device), lamb, threads)


PLANNED_GPU = PrecisionChoice(
    "bf16",
    "assumed a GPU with bf16 tensor cores (compute capability 8.0+: A100, H100, H200); none is visible here",
)
"""``--dry-run``'s ``auto`` precision for CUDA where no GPU is visible (a login node): what the recipes' GPUs give."""


def plan_settings(cfg: Config, device: str) -> Settings:
    """What `resolve_settings` decides on ``device`` (``cpu`` or ``cuda``), for ``--dry-run``, which plans without
    starting anything and may plan for CUDA on a machine without a GPU: ``auto`` precision then takes
    `PLANNED_GPU`'s bf16 and says so. The compile toolchain is not checked (a plan compiles nothing; the run
    checks it at start): ``compile`` is what the setting asks for on ``device``."""
    dev = torch.device(device)
    if dev.type == "cuda" and cfg.train.precision == "auto" and not torch.cuda.is_available():
        precision = PLANNED_GPU
    else:
        precision = choose_precision(cfg.train.precision, dev)
    compiled = compile_choice(cfg.train.compile, dev, check_toolchain=False)
    lamb = lamb_implementation(cfg.optim.implementation, dev, check_toolchain=False)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    return _settings(cfg, dev, backend, precision, compiled, lamb, NO_THREADS)


def _settings(
    cfg: Config,
    device: torch.device,
    backend: str,
    precision: PrecisionChoice,
    compiled: CompileChoice,
    lamb: str,
    threads: ThreadPools,
) -> Settings:
    scope = compile_scope_choice(cfg.train.compile_scope, cfg.train.plugin)
    return Settings(
        device=device,
        backend=backend,
        precision=precision.name,
        precision_why=f"precision auto -> {precision.name}: {precision.why}"
        if cfg.train.precision == "auto"
        else cpu_fp16_warning(precision.name, device),
        compile=compiled.on,
        compile_why=f"{compiled.why}; {scope.why}" if compiled.on else compiled.why,
        compile_scope=scope.scope,
        lamb_implementation=lamb,
        fsdp_reduce_every_micro_step=fsdp_reduce_every_micro_step(cfg.train.fsdp_accumulation, precision.name),
        threads=threads.size,
        threads_why=threads.why,
    )
