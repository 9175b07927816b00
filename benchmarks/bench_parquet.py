"""Parquet -> TFRecord copy: ``imagenet_to_tfrecord --src <parquet folder>`` (2 workers) vs ``cp -r`` of the same bytes.

Question: Does copying a Hugging Face parquet set into TFRecords (no decode, no re-encode) run near the speed of
copying its files? And against the folder converter on the same images?
Goal: ``ratio_vs_cp`` >= 0.8 (bytes/s of the parquet files, converter against ``cp -r``).

Run: ``python -m benchmarks.bench_parquet [--quick]`` (CPU, 2 worker processes). Two sets, each written once as
the Hub lays it out (`data_tools.make_parquet_dataset`: row groups of 100 rows, 4 files a split): the digits demo
(1,797 images of ~1 KB: a set where per-image costs dominate) and the ImageNet-shaped set of
`benchmarks.bench_convert` (1,200 photos of ~60 KB with ``--quick``, 6,000 without). Beside them, the floor of
any copy through pyarrow and Python (`benchmarks.parquet_floor`: the same reads, the two CRC32Cs, the writes
and fsyncs, with nothing else), and the converter with every row group read dictionary-encoded (`DICTIONARY`:
what plain reads save). Both sides read a
page-cached source and write to the same file system; the converter fsyncs every shard, so ``cp -r`` is timed
alone (the goal's baseline) and followed by ``sync``. ``REPEATS`` interleaved runs, each into a fresh folder;
medians of source bytes / wall seconds (the converter's whole command, Python's start-up included, as ``cp``'s;
16 training and 2 validation shards, as `benchmarks.bench_convert` writes), and each contender's CPU seconds (user +
system, of the processes it ran: on a shared machine the wall time counts the other users' load, the CPU time less).
Writes ``benchmarks/results/parquet.json``.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import sys
from pathlib import Path

from benchmarks.bench_convert import (
    CONVERT_RUN,
    WORKERS,
    _warm,
    against_cp,
    bench_images,
    bench_root,
    timed_commands,
    timed_once,
)
from benchmarks.harness import results, timing

REPEATS = 3
FLOOR = "pyarrow floor"  # benchmarks.parquet_floor: the least a copy through pyarrow costs
DICTIONARY = "convert parquet, dictionary read"  # the converter as it read every file before plain reads
# The converter with every row group read dictionary-encoded, set here at the benchmark's edge (no switch in the
# converter): its forked workers inherit the module's value.
DICTIONARY_CODE = (
    "import sys; import data_tools.parquet_source as p; p.PLAIN_CHUNK_MAX = -1; "
    "from data_tools.imagenet_to_tfrecord import main; sys.exit(main(sys.argv[1:]))"
)


def parquet_set(name: str, tree: Path) -> tuple[Path, int]:
    """``tree`` written as the Hub's parquet layout under the bench folder (once); (folder, its bytes)."""
    from data_tools.make_parquet_dataset import write_parquet

    out = bench_root() / f"parquet-{name}"
    if not (out / ".complete").exists():
        shutil.rmtree(out, ignore_errors=True)
        write_parquet(str(tree), str(out), files_per_split=4, rows_per_group=100)
        (out / ".complete").write_text("ok\n")
    return out, sum(f.stat().st_size for f in (out / "data").iterdir())


def digits_tree() -> Path:
    from data_tools.make_demo_dataset import write_digit_jpegs

    tree = bench_root() / "digits-src"
    write_digit_jpegs(str(tree))
    return tree


def measure(src: Path, tree: Path, total: int, repeats: int) -> dict:
    """Each contender's seconds on the parquet set ``src`` (``tree``: its images as a folder, which the folder
    converter takes: the same records from the other source)."""
    _warm(src)
    _warm(tree)
    work = bench_root() / "parquet-runs"

    cpu: dict[str, list[float]] = {}

    def contender(name: str):
        source = src if name.startswith("convert parquet") else tree
        args = ["--src", str(source), "--out", str(work / "out"), "--train-shards", "16", "--val-shards", "2"]

        def once() -> float:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            if name == FLOOR:  # benchmarks.parquet_floor with the converter's workers
                floor = [sys.executable, "-m", "benchmarks.parquet_floor", str(src), str(work / "floor")]
                seconds = timed_commands(work, [*floor, "--workers", str(WORKERS)])
            elif name == DICTIONARY:  # the converter's command, run with DICTIONARY_CODE's setting
                seconds = timed_commands(work, [sys.executable, "-c", DICTIONARY_CODE, *args, *CONVERT_RUN])
            else:
                seconds = timed_once(work, src, name, args)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.setdefault(name, []).append(
                after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            )  # the processes it ran and waited for: the converter's workers too, and the rm/sync around them
            return seconds

        return once

    names = ("cp -r", "cp -r + sync", FLOOR, "convert parquet", DICTIONARY, "convert folder")
    timings = timing.interleaved({name: contender(name) for name in names}, repeats)
    shutil.rmtree(work, ignore_errors=True)
    cpu_seconds = {k: round(statistics.median(v), 3) for k, v in cpu.items()}
    return {"source_mb": round(total / 1e6, 1), **against_cp(timings, total), "median_cpu_seconds": cpu_seconds}


def run(quick: bool, tiny: bool = False) -> dict:
    tiny = results.is_tiny(tiny)
    repeats = 1 if tiny else REPEATS
    photos = bench_images(quick, tiny)[0]
    sets = {"imagenet-shaped": (photos, *parquet_set(f"photos-{'tiny' if tiny else quick}", photos))}
    if not tiny:
        tree = digits_tree()
        sets = {"digits": (tree, *parquet_set("digits", tree)), **sets}
    result = {
        "benchmark": "parquet",
        "quick": quick,
        "workers": WORKERS,
        "repeats": repeats,
        "sets": {
            name: {"folder": str(src), **measure(src, tree, total, repeats)}
            for name, (tree, src, total) in sets.items()
        },
        "goal": "convert parquet >= 0.8x cp -r",
        "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
    }
    results.write_result("parquet", result)
    return result


if __name__ == "__main__":
    results.cli(run, __doc__)
