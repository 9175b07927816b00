"""Repeated augmentation's record reads (``data.repeats``): what they cost the training thread, and whether
``data.read_workers`` takes them off it.

Question: With ``data.repeats=3``, how much CPU time per batch does the thread that calls ``next(loader)``
(the training thread) spend, with the records read in it (``read_workers=0``) and by DALI's parallel
external source (``read_workers=2``), against the plain TFRecord reader?
Goal: with read workers, the training thread's CPU per batch within 1.5x the plain reader's.

Run: ``python -m benchmarks.bench_repeats [--quick]`` (CPU only; the bench data set of bench_data: ImageNet-like
~62 KB JPEGs at ~500x375; batches of 64 at 224 px with the random-resized crop, 2 DALI threads).
Writes ``benchmarks/results/repeats.json``. Each contender's loader is built afresh each round, warmed up, then
``batches`` batches are timed; rounds are interleaved and medians reported. ``thread_cpu_ms_per_batch`` is
``time.thread_time()`` of the calling thread around ``next(loader)``: on a GPU the training thread launches
the kernels, so CPU it spends in the loader is what a step cannot overlap. Wall images/s on a 2-core machine is
bounded by JPEG decoding in every contender.

Contenders:
- ``reader``: ``TrainLoader`` without repeats (DALI's TFRecord reader in its own threads).
- ``repeats_in_thread``: ``repeats=3, read_workers=0``: the ``external_source`` reads and parses the records
  in the calling thread.
- ``repeats_workers2``: ``repeats=3, read_workers=2``: two spawned reader processes.
Also ``read_ms_per_record``: the reader's own cost, one record at a time from the page cache. As root, each
contender runs once more as ``*_cold``, its loader built right after the page cache is dropped (``drop_caches``):
the records come from the disk, as from a file system that does not hold the data set in memory. With
repeats, the copies of a record follow each other, so a third of the reads are cold.
"""

from __future__ import annotations

import os
import statistics
import time

from benchmarks.harness import results, timing

REPEATS = 3
BATCH, SIZE, THREADS = 64, 224, 2


def _loader(data_dir: str, batch: int, repeats: int, workers: int):
    import torch

    from vitlarge.data import TrainLoader, TrainSpec

    spec = TrainSpec(
        data_dir,
        batch,
        SIZE,
        seed=0,
        num_threads=THREADS,
        repeats=repeats,
        read_workers=workers,
    )
    return TrainLoader(spec, rank=0, world_size=1, device=torch.device("cpu"))


def _measure(loader, batch: int, batches: int, warmup: int) -> tuple[float, float]:
    """(images per wall second, calling thread's CPU ms per batch) over ``batches`` after ``warmup``."""
    for _ in range(warmup):
        next(loader)
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(batches):
        next(loader)
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    return batches * batch / wall, 1e3 * cpu / batches


def _read_ms_per_record(data_dir: str, records: int) -> float:
    from vitlarge.data.manifest import load_manifest, shard_files
    from vitlarge.data.repeats import RepeatedRecords

    reader = RepeatedRecords(shard_files(load_manifest(data_dir), "train"), rank=0, world_size=1, repeats=3, seed=0)

    class Info:
        def __init__(self, i):
            self.idx_in_epoch = i

    reader(Info(0))  # the epoch's order (timm's sampler) and the first open
    t = time.perf_counter()
    for i in range(1, records + 1):
        reader(Info(i))
    ms = 1e3 * (time.perf_counter() - t) / records
    reader.close()
    return ms


DROP_CACHES = "/proc/sys/vm/drop_caches"


def _can_drop_caches() -> bool:
    return os.geteuid() == 0 and os.access(DROP_CACHES, os.W_OK)


def _drop_caches() -> None:
    os.sync()
    with open(DROP_CACHES, "w") as f:
        f.write("1\n")


def run(quick: bool, tiny: bool = False) -> dict:
    import torch

    from benchmarks.bench_convert import bench_shards

    tiny = results.is_tiny(tiny)
    torch.set_num_threads(1)
    data_dir = str(bench_shards(quick, tiny))
    b = 8 if tiny else BATCH
    batches, warmup, repeats = (2, 1, 1) if tiny else (15 if quick else 60, 4, REPEATS)
    contenders = {
        "reader": (1, 0),
        "repeats_in_thread": (3, 0),
        "repeats_workers2": (3, 2),
    }

    def contender(repeats_, workers):
        loader = _loader(data_dir, b, repeats_, workers)
        try:
            return _measure(loader, b, batches, warmup)
        finally:
            del loader

    cold = _can_drop_caches() and not tiny
    runs = {name: (lambda r=r, w=w: contender(r, w)) for name, (r, w) in contenders.items()}
    if cold:  # the same, each loader built right after the page cache is dropped: the shards come from disk
        runs |= {
            f"{name}_cold": (lambda r=r, w=w: (_drop_caches(), contender(r, w))[1])
            for name, (r, w) in contenders.items()
        }
    times = timing.interleaved_wall_cpu(runs, repeats)
    ips = {k: statistics.median(t["wall_s"]) for k, t in times.items()}  # images/s here
    cpu = {k: statistics.median(t["cpu_s"]) for k, t in times.items()}  # thread CPU ms per batch here
    read_ms = _read_ms_per_record(data_dir, 64 if tiny else 1000)
    result = {
        "benchmark": "repeats",
        "quick": quick,
        "batch_size": b,
        "image_size": SIZE,
        "dali_threads": THREADS,
        "timed_batches": batches,
        "repeats": repeats,
        "images_per_s_median": {k: round(v, 1) for k, v in ips.items()},
        "thread_cpu_ms_per_batch_median": {k: round(v, 2) for k, v in cpu.items()},
        "thread_cpu_ms_per_batch_all": {k: [round(x, 2) for x in t["cpu_s"]] for k, t in times.items()},
        "read_ms_per_record": round(read_ms, 4),
        "cold_cache": cold,
        "workers_vs_reader_thread_cpu": round(cpu["repeats_workers2"] / max(cpu["reader"], 1e-9), 2),
        "in_thread_vs_reader_thread_cpu": round(cpu["repeats_in_thread"] / max(cpu["reader"], 1e-9), 2),
        **(
            {
                "cold_workers_vs_in_thread_images_per_s": round(
                    ips["repeats_workers2_cold"] / ips["repeats_in_thread_cold"], 2
                ),
                "cold_in_thread_vs_reader_thread_cpu": round(
                    cpu["repeats_in_thread_cold"] / max(cpu["reader_cold"], 1e-9), 2
                ),
                "cold_workers_vs_reader_thread_cpu": round(
                    cpu["repeats_workers2_cold"] / max(cpu["reader_cold"], 1e-9), 2
                ),
            }
            if cold
            else {}
        ),
        "goal": "repeats_workers2's thread CPU per batch <= 1.5x reader's",
    }  # write_result adds the machine: CPU, cores, load average at the end
    results.write_result("repeats", result)
    return result


if __name__ == "__main__":
    results.cli(run, __doc__)
