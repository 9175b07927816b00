"""Conversion throughput: data_tools.imagenet_to_tfrecord (2 workers) vs ``cp -r`` of the same tree.

Question: Does converting JPEGs to TFRecords run near the speed of merely copying them?
Goal: ``ratio_vs_cp`` of ``convert header-check`` >= 0.5.

Run: ``python -m benchmarks.bench_convert [--quick]`` (CPU, 2 worker processes; quick: 1,200
ImageNet-like JPEGs, ~75 MB, ~1 min including making the images once; full: 6,000).
Writes ``benchmarks/results/convert.json``. Both sides read a page-cached source tree and write
to the same file system; the converter also fsyncs every shard, so we time ``cp -r`` both alone
(the goal's baseline) and followed by ``sync``. Each side runs
``REPEATS`` times into a fresh directory, interleaved; we report medians of source bytes / wall
seconds (converter: the whole ``python -m data_tools.imagenet_to_tfrecord`` command, including
Python's start-up and its worker processes, as ``cp`` includes its own).
Goal: converter >= 0.5x the bytes/s of ``cp -r``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import results, timing

ROOT = Path(__file__).resolve().parent.parent

REPEATS = 3
WORKERS = 2


def bench_root() -> Path:
    """Generated images and shards are cached here between runs (VITLARGE_BENCH_DIR overrides)."""
    return Path(os.environ.get("VITLARGE_BENCH_DIR", os.path.join(tempfile.gettempdir(), "vitlarge-bench")))


def bench_images(quick: bool, tiny: bool = False) -> tuple[Path, int]:
    """An ImageFolder tree of ImageNet-like JPEGs (made once); returns (root, total bytes). tiny: 40 images."""
    from data_tools.make_bench_dataset import make_bench_dataset

    n, classes = (40, 4) if tiny else (1200 if quick else 6000, 10)
    root = bench_root() / (f"jpeg-tiny-{n}" if tiny else f"jpeg-{n}")
    make_bench_dataset(str(root), num_images=n, classes=classes, val_fraction=0.1)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs if f.endswith(".JPEG"))
    return root, total


def bench_shards(quick: bool, tiny: bool = False) -> Path:
    """The same images converted to TFRecords (made once), for the loader benchmark."""
    from data_tools.imagenet_to_tfrecord import convert

    src, _ = bench_images(quick, tiny)
    out = bench_root() / f"tfrecord-{src.name}"
    if not (out / "dataset.json").exists():
        convert(str(src), str(out), train_shards=8, val_shards=2, workers=WORKERS, progress=False)
    return out


def _warm(root: Path) -> None:
    for d, _, fs in os.walk(root):
        for f in fs:
            with open(os.path.join(d, f), "rb") as fh:
                while fh.read(1 << 20):
                    pass


def timed_once(work: Path, src: Path, name: str, convert_args: list[str]) -> float:
    """Wall seconds of one run of contender ``name`` into a fresh ``work``: ``cp -r`` of ``src`` (then ``sync`` for
    ``cp -r + sync``: the converter fsyncs its shards, this cp pays for its writes too), or the converter's command
    with ``convert_args`` and `WORKERS` workers, in its own process as users run it (as cp runs; this process has
    loaded torch, which would make convert() spawn its workers instead of forking)."""
    if name.startswith("cp"):
        synced = [["sync"]] if name.endswith("sync") else []
        return timed_commands(work, ["cp", "-r", str(src), str(work / "copy")], *synced, quiet=False)
    return timed_commands(work, [sys.executable, "-m", "data_tools.imagenet_to_tfrecord", *convert_args, *CONVERT_RUN])


CONVERT_RUN = ["--workers", str(WORKERS), "--no-progress"]  # how the benchmarks run a converter


def timed_commands(work: Path, *commands: list[str], quiet: bool = True) -> float:
    """Wall seconds of ``commands``, one after another, from the checkout's root, into a fresh ``work``, after a
    ``sync`` (each contender starts with no dirty pages pending); ``quiet``: their stderr (a converter's summary)
    not shown."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run(["sync"], check=True)
    t = time.perf_counter()
    for command in commands:
        subprocess.run(command, check=True, stderr=subprocess.DEVNULL if quiet else None, cwd=ROOT)
    return time.perf_counter() - t


def against_cp(timings: dict[str, list[float]], total: int) -> dict:
    """Each contender's seconds (median and all), source bytes/s, and the others' (converters, floors) ratio to
    ``cp -r`` and to ``cp -r + sync``."""
    mbps = {k: total / statistics.median(v) / 1e6 for k, v in timings.items()}
    return {
        "median_seconds": {k: round(statistics.median(v), 3) for k, v in timings.items()},
        "all_seconds": {k: [round(x, 3) for x in v] for k, v in timings.items()},
        "mb_per_s": {k: round(v, 1) for k, v in mbps.items()},
        "ratio_vs_cp": {k: round(v / mbps["cp -r"], 2) for k, v in mbps.items() if not k.startswith("cp")},
        "ratio_vs_cp_sync": {k: round(v / mbps["cp -r + sync"], 2) for k, v in mbps.items() if not k.startswith("cp")},
    }


def run(quick: bool, tiny: bool = False) -> dict:
    tiny = results.is_tiny(tiny)
    repeats = 1 if tiny else REPEATS
    src, total = bench_images(quick, tiny)
    _warm(src)
    work = bench_root() / "convert-runs"

    def contender(name: str):
        check = ["--check", name.split()[1].split("-")[0]] if name.startswith("convert") else []
        args = ["--src", str(src), "--out", str(work / "out"), "--train-shards", "16", "--val-shards", "2", *check]
        return lambda: timed_once(work, src, name, args)

    names = ("cp -r", "cp -r + sync", "convert header-check", "convert decode-check")
    timings = timing.interleaved({name: contender(name) for name in names}, repeats)
    shutil.rmtree(work, ignore_errors=True)
    result = {
        "benchmark": "convert",
        "quick": quick,
        "images": len([1 for _, _, fs in os.walk(src) for f in fs if f.endswith(".JPEG")]),
        "source_mb": round(total / 1e6, 1),
        "workers": WORKERS,
        "repeats": repeats,
        **against_cp(timings, total),
        "goal": "convert header-check >= 0.5x cp -r",
        "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
    }
    results.write_result("convert", result)
    return result


if __name__ == "__main__":
    results.cli(run, __doc__)
