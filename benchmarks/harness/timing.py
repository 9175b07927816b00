"""Timing: one call's wall and CPU time, medians, contenders interleaved, a matmul's FLOP/s.

Timings are taken side by side in one process, interleaved contender by contender (`interleaved`),
so load from other processes on a shared machine hits every contender alike; we report medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


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


def per_step(fn: Callable[[], object], steps: int) -> tuple[float, float]:
    """`timed` of ``steps`` calls of ``fn``, divided by ``steps``."""
    w, c = timed(lambda: [fn() for _ in range(steps)])
    return w / steps, c / steps


def device_seconds(fn: Callable[[], object], device) -> float:
    """Seconds ``fn`` takes on ``device``: CUDA events around it (queued work included), or wall time."""
    import torch

    if device.type != "cuda":
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def interleaved(contenders: dict[str, Callable[[], object]], rounds: int) -> dict[str, list]:
    """Runs each contender once per round, round-robin, ``rounds`` rounds; ``{name: [what it returned]}``.

    Rounds start with a different contender each time, so a slow start or end of the machine's busy
    period does not fall on the same one."""
    names = list(contenders)
    out = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            out[n].append(contenders[n]())
    return out


def interleaved_wall_cpu(contenders: dict[str, Callable[[], tuple[float, float]]], rounds: int) -> dict:
    """`interleaved` over contenders that return ``(wall_s, cpu_s)`` for one measurement (it may time
    several steps and return the per-step mean): ``{name: {"wall_s": [...], "cpu_s": [...]}}``."""
    times = interleaved(contenders, rounds)
    return {n: {"wall_s": [w for w, _ in t], "cpu_s": [c for _, c in t]} for n, t in times.items()}


def images_per_s(times: dict, micro_batch: int, threads: int) -> dict:
    """Per contender of `interleaved_wall_cpu`: step time and CPU time per step (summaries), images/s
    by wall time and by CPU time over ``threads`` (what an idle machine would show)."""
    res = {}
    for name, t in times.items():
        w, c = median(t["wall_s"]), median(t["cpu_s"])
        res[name] = {
            "step_s": summary(t["wall_s"]),
            "cpu_s_per_step": summary(t["cpu_s"]),
            "images_per_s": round(micro_batch / w, 2),
            "images_per_s_cpu": round(micro_batch / (c / threads), 2),
        }
    return res


def matmul_peak(n: int, dtype, repeats: int, device=None, iters: int = 1, warmup: int = 1) -> dict:
    """FLOP/s of ``iters`` back-to-back n x n x n ``torch.matmul`` in ``dtype`` after ``warmup`` calls,
    median of ``repeats``: by `device_seconds` and (CPU) per CPU-second x threads."""
    import torch

    device = device or torch.device("cpu")
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    for _ in range(warmup):  # cuBLAS heuristics, clocks up; first-touch pages
        torch.matmul(a, b)
    wall, cpu = [], []
    for _ in range(repeats):
        c = time.process_time()
        wall.append(device_seconds(lambda: [torch.matmul(a, b) for _ in range(iters)], device))  # noqa: F821 (ruff misreads the del below)
        cpu.append(time.process_time() - c)
    del a, b
    flops = 2 * n**3 * iters
    return {
        "n": n,
        "dtype": str(dtype).removeprefix("torch."),
        "flops_per_s": flops / median(wall),
        "flops_per_cpu_s_x_threads": flops / max(median(cpu), 1e-9) * torch.get_num_threads(),
    }
