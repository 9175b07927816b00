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
import contextlib
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

# Order: cheap and independent first; train/precision share the model of bench_train.
BENCHMARKS = ("data", "convert", "train", "optimizer", "comm", "precision")
MODULES = {name: f"benchmarks.bench_{name}" for name in BENCHMARKS}
OWN = ("train", "comm", "precision")  # take run(quick, tiny); the others take run(quick)


@contextlib.contextmanager
def shrunk_external(name: str, results: Path):
    """Tiny sizes for the benchmarks whose ``run`` has no ``tiny`` argument (data, convert, optimizer).

    Patches their module constants and helpers for the duration: 40 images instead of 1,200, one
    repeat, two timed batches of 8, a 1-block ViT for the optimizer; results under ``results``.
    Remove once those modules take ``tiny`` themselves.
    """
    import timm

    from benchmarks import bench_convert, bench_data

    def tiny_images(quick: bool):
        from data_tools.make_bench_dataset import make_bench_dataset

        root = bench_convert.bench_root() / "jpeg-tiny-40"
        make_bench_dataset(str(root), num_images=40, classes=4, val_fraction=0.1)
        total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs if f.endswith(".JPEG"))
        return root, total

    real_measure, real_create = bench_data._measure, timm.create_model
    with contextlib.ExitStack() as stack:
        enter = stack.enter_context
        enter(mock.patch.dict(os.environ, {"VITLARGE_BENCH_DIR": str(results / "bench-data")}))
        enter(mock.patch.object(bench_convert, "bench_images", tiny_images))
        enter(mock.patch.object(bench_convert, "REPEATS", 1))
        enter(mock.patch.object(bench_data, "REPEATS", 1))
        enter(mock.patch.object(bench_data, "BATCH", 8))
        enter(mock.patch.object(bench_data, "_measure", lambda step, batches, warmup=3: real_measure(step, 2, 1)))
        if name == "optimizer":
            enter(mock.patch.object(timm, "create_model", lambda model, **kw: real_create(
                model, **{**kw, "depth": 1, "embed_dim": 32, "num_heads": 2, "img_size": 32})))
        yield


def run_one(name: str, quick: bool, tiny: bool) -> dict:
    module = importlib.import_module(MODULES[name])
    return module.run(quick, tiny) if name in OWN else module.run(quick)


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
            if tiny:  # in-process: the smoke test shrinks the inputs by patching module constants
                with shrunk_external(name, results):
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
        print(f"== {name}: {'ok' if status[name]['ok'] else 'FAILED'} in {status[name]['seconds']} s "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
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
    print(f"suite: {time.perf_counter() - t:.0f} s; " + ", ".join(
        f"{k} {'ok' if v['ok'] else 'FAILED'} ({v['seconds']} s)" for k, v in status.items()))
    return 0 if all(v["ok"] for v in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
