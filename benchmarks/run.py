"""The benchmark suite: every comparison, then docs/PERFORMANCE.md and its plots.

    python -m benchmarks.run --quick      # < 10 min on 2 CPU cores; what `make bench` runs
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
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from unittest import mock

from benchmarks import common  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)

# Order: cheap and independent first; train/precision/compile share the model of bench_train; compile
# last: it spends minutes compiling ViT-S/16 (about one under --tiny, where it still compiles, a 1-block model).
BENCHMARKS = ("data", "convert", "train", "optimizer", "comm", "precision", "compile")
MODULES = {name: f"benchmarks.bench_{name}" for name in BENCHMARKS}


def run_one(name: str, quick: bool, tiny: bool) -> dict:
    """Every benchmark honours common.py's contract: ``run(quick, tiny)``."""
    return importlib.import_module(MODULES[name]).run(quick, tiny)


def run_all(quick: bool, tiny: bool = False, only: tuple[str, ...] = BENCHMARKS, report: bool = True) -> dict:
    """Runs the named benchmarks; returns ``{name: {"ok", "seconds", "error"}}`` and writes the report."""
    tiny = common.is_tiny(tiny)
    if tiny and "VITLARGE_BENCH_RESULTS" not in os.environ:
        os.environ["VITLARGE_BENCH_RESULTS"] = tempfile.mkdtemp(prefix="vitlarge-bench-tiny-")
    results = common.results_dir()
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
        from benchmarks import report as rep

        docs = results if tiny else rep.DOCS
        path = rep.generate(results, docs / "PERFORMANCE.md", docs / "img")
        print(f"wrote {path}")
    return status


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats and smaller inputs (< 10 min)")
    p.add_argument("--tiny", action="store_true", help="smoke-test sizes into a temp dir; numbers mean nothing")
    p.add_argument("--only", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS))
    p.add_argument("--no-report", action="store_true", help="do not regenerate docs/PERFORMANCE.md")
    args = p.parse_args(argv)
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
