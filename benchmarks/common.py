"""Shared by the benchmarks: machine description, interleaved timing, medians, atomic result files.

Contract: every benchmark's ``run(quick, tiny=False)`` returns a dict and writes it to
``benchmarks/results/<name>.json`` through `write_result`, which adds ``machine`` (CPU, flags,
threads, versions, load average at the end). Timings are taken side by side in one process,
interleaved contender by contender (`interleaved`), so load from other processes on a shared
machine hits every contender alike; we report medians. ``tiny`` (or ``VITLARGE_BENCH_TINY=1``)
shrinks every size so the smoke test runs each benchmark in seconds: its numbers mean nothing.
"""

from __future__ import annotations

import os

# libgomp's default wait policy spins, then sleeps; with 2 threads on 2 cores that other processes
# also use, a parallel region waits for a descheduled thread: a tiny ViT step took 0.74 s instead of
# 0.01 s (measured, load 7). PASSIVE makes both contenders pay the same small, steady cost. It must
# be set before torch loads libgomp, so the benchmarks import this module before torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from vitlarge.fileio import write_atomic

RESULTS_DIR = Path(__file__).parent / "results"
TINY_ENV = "VITLARGE_BENCH_TINY"


def threads(tiny: bool) -> int:
    """2 threads (the machine's cores); 1 at smoke-test sizes, where thread hand-offs dominate."""
    return 1 if tiny else 2


def is_tiny(tiny: bool = False) -> bool:
    return tiny or os.environ.get(TINY_ENV, "") not in ("", "0")


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


def median(values: list[float]) -> float:
    return statistics.median(values)


def summary(values: list[float], digits: int = 4) -> dict:
    """Median and every repeat, rounded; the median is the number the report uses."""
    return {"median": round(median(values), digits), "all": [round(v, digits) for v in values]}


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process over all its threads) of one call."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def interleaved(contenders: dict[str, Callable[[], tuple[float, float]]], repeats: int) -> dict:
    """Runs each contender once per round, round-robin, ``repeats`` rounds.

    A contender returns ``(wall_s, cpu_s)`` for one measurement (it may time several steps and
    return the per-step mean). Returns ``{name: {"wall_s": [...], "cpu_s": [...]}}``. Rounds start
    with a different contender each time, so a slow start or end of the machine's busy period does
    not fall on the same one.
    """
    names = list(contenders)
    out = {n: {"wall_s": [], "cpu_s": []} for n in names}
    for r in range(repeats):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            w, c = contenders[n]()
            out[n]["wall_s"].append(w)
            out[n]["cpu_s"].append(c)
    return out


def cli(run: Callable[[bool, bool], dict], doc: str, show: Callable[[dict], None] | None = None) -> None:
    """A benchmark's command line: ``--quick`` and ``--tiny`` go to ``run(quick, tiny)``; ``show``
    prints the result (default: as JSON)."""
    import argparse
    import warnings

    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats and smaller inputs")
    p.add_argument("--tiny", action="store_true", help="smoke-test sizes; the numbers mean nothing")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    result = run(a.quick, a.tiny)
    if show is None:
        print(json.dumps(result, indent=1))
    else:
        show(result)


def write_result(name: str, result: dict) -> Path:
    """Writes ``<results>/<name>.json`` atomically (`vitlarge.fileio.write_atomic`), with the machine added."""
    result = {**result, "machine": machine(), "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = results_dir() / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(result, indent=1) + "\n")
    return out


def init_single_process_group() -> None:
    """gloo, world size 1, through vitlarge.distributed.launch as train.py does (no-op if already initialised)."""
    import torch.distributed as dist

    from vitlarge.distributed import launch, launcher

    if not dist.is_initialized():
        env = launcher.DistEnv(0, 1, 0, "127.0.0.1", launcher.free_port(), "single")
        launch.init_distributed(env, "gloo")
