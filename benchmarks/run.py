"""The registry of every benchmark (`REGISTRY`) and the suite runner: the comparisons, then docs/PERFORMANCE.md.

    python -m benchmarks.run --quick      # < 10 min on 2 CPU cores; what `make bench` runs
    python -m benchmarks.run --list       # every benchmark, its question, and how it runs
    python -m benchmarks.run              # more repeats and larger inputs
    python -m benchmarks.run --only train comm --no-report

Each benchmark runs its contenders side by side in one process, interleaved, repeats >= 3 times
and writes ``benchmarks/results/<name>.json`` (medians, every repeat, the machine and its load).
A failing benchmark is reported and the others still run; the exit status is 1 if any failed.
``--tiny`` (the smoke test) shrinks every input so the suite runs in about a minute; its numbers
mean nothing, so it writes results and the report under ``VITLARGE_BENCH_RESULTS`` (a temp dir
unless set), never over the real ones.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from benchmarks.harness import results as harness_results  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)


@dataclass(frozen=True)
class Benchmark:
    """One entry of the registry: ``benchmarks/bench_<name>.py``.

    ``suite``: run by ``python -m benchmarks.run`` (and ``make bench``) unless ``--only`` says
    otherwise. ``own_cli``: it has no ``run(quick, tiny)`` entry for this runner (a long or
    privileged measurement with its own flags); run ``python -m benchmarks.bench_<name>``."""

    name: str
    question: str
    suite: bool = False
    own_cli: bool = False


# Suite order: cheap and independent first; train/precision/compile share the model of bench_train;
# compile last: it spends minutes compiling ViT-S/16 (about one under --tiny, where it still compiles,
# a 1-block model). The others run on their own: minutes of multi-process runs, root and Slurm, or
# whole training schedules, which the smoke test cannot afford.
REGISTRY = (
    Benchmark("data", "Does the DALI TrainLoader feed >= 2x the images/s of torchvision?", suite=True),
    Benchmark("convert", "Does the TFRecord converter write >= 0.5x the bytes/s of cp -r?", suite=True),
    Benchmark("parquet", "Does copying a Hugging Face parquet set into TFRecords run >= 0.8x as fast as cp -r?"),
    Benchmark("train", "Does train.py's step reach >= 0.97x a bare loop's images/s, and what MFU?", suite=True),
    Benchmark("optimizer", "Is our LAMB step >= 3x faster than Colossal-AI's on CPU?", suite=True),
    Benchmark("comm", "Is there one gradient all-reduce per DDP bucket, whatever the accumulation?", suite=True),
    Benchmark("precision", "Which autocast dtype trains fastest on this CPU?", suite=True),
    Benchmark("compile", "What do train.compile=on's step time and compile time cost on CPU?", suite=True),
    Benchmark(
        "compile_matrix",
        "Does every compiled combination (ddp/fsdp x checkpointing x bf16/fp16/fp32) train and resume bitwise?",
    ),
    Benchmark("fsdp_memory", "Does fsdp hold within 10% of 1/W of the unsharded state per rank?"),
    Benchmark("fsdp_accumulation", "How much gradient memory do no_sync and reduce_scatter hold?"),
    Benchmark("fsdp_activations", "How much activation memory does full recomputation save under fsdp?"),
    Benchmark(
        "activation_checkpointing",
        "What do train.activation_checkpointing full and selective keep for backward and cost, against off?",
    ),
    Benchmark("fsdp_collectives", "How many collectives per micro-step and per step does fsdp issue?"),
    Benchmark("repeats", "Do read workers keep data.repeats' record reads off the training thread?"),
    Benchmark("tfds", "Does the TrainLoader read a TFDS folder in place at >= 0.95x its TFRecords' images/s?"),
    Benchmark("wds", "Does the TrainLoader read WebDataset tars in place at >= 0.95x the images/s of TFRecords?"),
    Benchmark("launch", "Does srun start the demo as fast as colossalai run? (needs root and Slurm)"),
    Benchmark("shuffle", "How well does the reader shuffle an ImageNet-shaped epoch?", own_cli=True),
    Benchmark("progressive", "Is progressive resolution as accurate as fixed, and faster?", own_cli=True),
    Benchmark(
        "rect_val", "Does rectangular validation score at least the square crop, and at what cost?", own_cli=True
    ),
    Benchmark("timm_parity", "Does vitlarge with DeiT III's pieces train as well as timm's train.py?", own_cli=True),
    Benchmark("checkpoint_io", "What does each rank read, and hold, to resume a checkpoint?", own_cli=True),
    Benchmark("startup", "Does train.py spend no more time outside its loop than timm's train.py?", own_cli=True),
)
BY_NAME = {b.name: b for b in REGISTRY}
BENCHMARKS = tuple(b.name for b in REGISTRY if b.suite)  # the suite, in order
RUNNABLE = tuple(b.name for b in REGISTRY if not b.own_cli)
MODULES = {b.name: f"benchmarks.bench_{b.name}" for b in REGISTRY}


def run_one(name: str, quick: bool, tiny: bool) -> dict:
    """Every runnable benchmark honours benchmarks.harness.results' contract: ``run(quick, tiny)``."""
    return importlib.import_module(MODULES[name]).run(quick, tiny)


def run_all(quick: bool, tiny: bool = False, only: tuple[str, ...] = BENCHMARKS, report: bool = True) -> dict:
    """Runs the named benchmarks; returns ``{name: {"ok", "seconds", "error"}}`` and writes the report."""
    tiny = harness_results.is_tiny(tiny)
    results = harness_results.tiny_results_dir() if tiny else harness_results.results_dir()
    status = {}
    for name in only:
        t = time.perf_counter()
        print(f"== {name} ...", flush=True)
        try:
            if tiny:  # in-process, each benchmark at its own tiny sizes; generated data under the results
                with mock.patch.dict(os.environ, {"VITLARGE_BENCH_DIR": str(results / "bench-data")}):
                    run_one(name, quick, tiny)
            else:
                # Each benchmark in a fresh process: what one leaves behind (GBs of freed optimizer
                # state, DALI and DataLoader threads, an initialised process group) halved another's
                # ratios when they shared one (measured: LAMB 4.2x alone, 2.1x after the others).
                cmd = [sys.executable, "-m", f"benchmarks.bench_{name}"] + (["--quick"] if quick else [])
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent)
            status[name] = {"ok": True, "error": None}
        except Exception as e:  # one broken benchmark must not hide the others' numbers
            traceback.print_exc()
            status[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        status[name]["seconds"] = round(time.perf_counter() - t, 1)
        print(
            f"== {name}: {'ok' if status[name]['ok'] else 'FAILED'} in {status[name]['seconds']} s "
            f"(load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
    if report:
        from benchmarks.report import performance as rep

        docs = results if tiny else rep.DOCS
        path = rep.generate(results, docs / "PERFORMANCE.md", docs / "img")
        print(f"wrote {path}")
    return status


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats and smaller inputs (< 10 min)")
    p.add_argument("--tiny", action="store_true", help="smoke-test sizes into a temp dir; numbers mean nothing")
    p.add_argument("--only", nargs="+", choices=RUNNABLE, default=list(BENCHMARKS))
    p.add_argument("--no-report", action="store_true", help="do not regenerate docs/PERFORMANCE.md")
    p.add_argument("--list", action="store_true", help="list every benchmark and its question, then exit")
    args = p.parse_args(argv)
    if args.list:
        for b in REGISTRY:
            where = "suite" if b.suite else "own command line" if b.own_cli else "--only"
            print(f"{b.name:18} {where:16} {b.question}")
        return 0
    warnings.filterwarnings("ignore")
    t = time.perf_counter()
    status = run_all(args.quick, args.tiny, tuple(args.only), report=not args.no_report)
    print(
        f"suite: {time.perf_counter() - t:.0f} s; "
        + ", ".join(f"{k} {'ok' if v['ok'] else 'FAILED'} ({v['seconds']} s)" for k, v in status.items())
    )
    return 0 if all(v["ok"] for v in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
