"""Results of a benchmark: machine description, command line, atomic ``<results>/<name>.json`` files.

Contract: every benchmark's ``run(quick, tiny=False)`` returns a dict and writes it to
``benchmarks/results/<name>.json`` through `write_result`, which adds ``machine`` (CPU, flags,
threads, versions, load average at the end). ``tiny`` (or ``VITLARGE_BENCH_TINY=1``) shrinks every
size so the smoke test runs each benchmark in seconds: its numbers mean nothing.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"
TINY_ENV = "VITLARGE_BENCH_TINY"


def threads(tiny: bool) -> int:
    """2 threads (the machine's cores); 1 at smoke-test sizes, where thread hand-offs dominate."""
    return 1 if tiny else 2


def is_tiny(tiny: bool = False) -> bool:
    return tiny or os.environ.get(TINY_ENV, "") not in ("", "0")


def tiny_results_dir() -> Path:
    """Where a smoke run (``--tiny``) writes: ``VITLARGE_BENCH_RESULTS`` where set, else a new temporary folder,
    set in the environment so that the rest of the run (its other benchmarks, the report) finds it. Its numbers
    mean nothing: in benchmarks/results they would be what docs/PERFORMANCE.md is generated from."""
    if "VITLARGE_BENCH_RESULTS" not in os.environ:
        os.environ["VITLARGE_BENCH_RESULTS"] = tempfile.mkdtemp(prefix="vitlarge-bench-tiny-")
    return results_dir()


_process_tiny_dir: list[Path] = []  # write_result's folder for a tiny result where no run set one (made once)


def _tiny_dir_here() -> Path:
    """A tiny result's folder for `write_result`: the run's (``VITLARGE_BENCH_RESULTS``) where set, else one temporary
    folder for this process, left out of the environment so that a full-size result written later in the same
    process still goes to benchmarks/results."""
    if "VITLARGE_BENCH_RESULTS" in os.environ:
        return results_dir()
    if not _process_tiny_dir:
        _process_tiny_dir.append(Path(tempfile.mkdtemp(prefix="vitlarge-bench-tiny-")))
    return _process_tiny_dir[0]


def results_dir() -> Path:
    """``VITLARGE_BENCH_RESULTS`` redirects results (the smoke test must not overwrite real ones)."""
    return Path(os.environ.get("VITLARGE_BENCH_RESULTS", str(RESULTS_DIR)))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    """The instruction-set flags that decide low-precision matmul speed (AMX is absent on many VMs)."""
    from vitlarge.model.precision import cpu_flags as all_flags

    return sorted(f for f in all_flags() if f.startswith(("amx", "avx512_bf16", "avx512_fp16", "avx512f")))


def machine() -> dict:
    import torch

    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "os_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],  # others share this CPU
    }


def cli(run: Callable[[bool, bool], dict], doc: str, show: Callable[[dict], None] | None = None) -> None:
    """A benchmark's command line: ``--quick`` and ``--tiny`` go to ``run(quick, tiny)``; ``show``
    prints the result (default: as JSON)."""
    import argparse
    import warnings

    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats and smaller inputs")
    p.add_argument("--tiny", action="store_true", help="smoke-test sizes; the numbers mean nothing")
    a = p.parse_args()
    if a.tiny:
        print(f"--tiny: results under {tiny_results_dir()} (the numbers mean nothing)", file=sys.stderr)
    warnings.filterwarnings("ignore")
    result = run(a.quick, a.tiny)
    if show is None:
        print(json.dumps(result, indent=1))
    else:
        show(result)


def write_result(name: str, result: dict) -> Path:
    """Writes ``<results>/<name>.json`` atomically (`vitlarge.fileio.write_atomic`), with the machine added; a
    smoke run's (``tiny`` in ``result`` or the environment) outside benchmarks/results (`_tiny_dir_here`)."""
    folder = _tiny_dir_here() if is_tiny(result.get("tiny") is True) else results_dir()
    result = {**result, "machine": machine(), "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    from vitlarge.fileio import write_atomic

    out = folder / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(result, indent=1) + "\n")
    return out


def describe(cfg, tiny: bool, quick: bool, rounds: int, steps: int, threads: int, precision: bool = False) -> dict:
    """The fields every one-process engine benchmark's result opens with: model, sizes, repeats, threads."""
    head = {
        "model": cfg.model.name,
        "model_kwargs": cfg.model.kwargs,
        "image_size": cfg.data.image_size,
        "micro_batch": cfg.train.micro_batch,
    }
    if precision:
        head["precision"] = cfg.train.precision
    return head | {"tiny": tiny, "quick": quick, "rounds": rounds, "steps_per_round": steps, "threads": threads}
