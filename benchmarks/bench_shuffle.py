"""How much one training epoch's order resembles the previous one: before and after each rank read every file.

Question: How much does one training epoch's order resemble the previous one's?
Goal: no target: the figures are ``before`` and ``after`` (``epoch_order_stats``), quoted in
docs/DATA.md.

    python -m benchmarks.bench_shuffle             # 4 ranks, ImageNet-shaped: 1,281,167 records, 1,024 shards
    python -m benchmarks.bench_shuffle --records 64000 --shards 64 --ranks 1

Order only: the records are identifiable (``data_tools.make_id_dataset``, label = record index)
and the pipelines run just the TFRecord reader, with the exact reader settings the training
pipeline uses (``vitlarge.data.pipelines._reader``, TrainLoader's default buffer and seeds), so
1.28M records x 2 epochs x 4 ranks take about 5 minutes on 2 cores (mostly writing the
records) instead of hours of decoding.
"before" is the reader as it was: each rank stuck to its slice (``stick_to_shard``), shuffled
only by the 4,096-record buffer. ``epoch_order_stats`` is also what tests/unit/data/test_loader.py
asserts on (through the full config -> train_loader path there).

Writes ``benchmarks/results/shuffle.json``; the figures are quoted in docs/DATA.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

from vitlarge.constants import IMAGENET_TRAIN_EXAMPLES

NEAR = 0.05  # "near": within 5% of the epoch of the previous position


def epoch_order_stats(streams: list[np.ndarray], num_records: int) -> dict:
    """Compare epoch 1 and epoch 2 of each rank's stream of record ids.

    ``streams[r]`` is rank r's ids in read order, at least two epochs' worth (2 x its share). A
    record's position in an epoch is the index of its first occurrence in that epoch's window of
    the rank's stream, divided by the window length (0..1). Returns ``near`` (fraction of records
    within ``NEAR`` of their previous-epoch position), ``corr`` (Pearson correlation of the
    positions), and ``min_seen``/``max_seen`` (times a record occurs over two epochs' worth).
    """
    pos = np.full((2, num_records), np.nan)
    counts = np.zeros(num_records, dtype=np.int64)
    for ids in streams:
        share = len(ids) // 2
        for epoch in range(2):
            window = np.asarray(ids[epoch * share : (epoch + 1) * share])
            first = np.unique(window, return_index=True)
            unseen = np.isnan(pos[epoch, first[0]])  # a record read by two ranks keeps its first position
            pos[epoch, first[0][unseen]] = first[1][unseen] / share
        np.add.at(counts, np.asarray(ids[: 2 * share]), 1)
    both = ~np.isnan(pos).any(axis=0)
    p1, p2 = pos[0, both], pos[1, both]
    return dict(
        near=float(np.mean(np.abs(p2 - p1) < NEAR)),
        corr=float(np.corrcoef(p1, p2)[0, 1]),
        min_seen=int(counts.min()),
        max_seen=int(counts.max()),
        in_both=float(both.mean()),
    )


def reader_streams(
    data_dir: str, ranks: int, *, before: bool, seed: int = 42, batch: int = 1024, initial_fill: int = 4096
) -> list[np.ndarray]:
    """Each rank's record ids over two epochs' worth, from the training reader alone."""
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def

    from vitlarge.data import pipelines
    from vitlarge.data.manifest import load_manifest, shard_files

    m = load_manifest(data_dir)
    files = shard_files(m, "train")
    n = m.num_examples("train")

    @pipeline_def
    def ids(rank):
        if before:
            data = fn.readers.tfrecord(
                path=[f for f, _ in files],
                index_path=[i for _, i in files],
                features=pipelines.FEATURES,
                shard_id=rank,
                num_shards=ranks,
                stick_to_shard=True,
                random_shuffle=True,
                initial_fill=initial_fill,
                seed=(seed * 7919 + rank) % (2**31 - 1),
            )
        else:  # the TrainLoader's seeds: one file order for all ranks, a buffer seed per rank
            _, label = pipelines._reader(
                files,
                shard_id=rank,
                num_shards=ranks,
                seed=(seed * 7919 + rank) % (2**31 - 1),
                training=True,
                initial_fill=initial_fill,
                file_order_seed=seed % (2**31 - 1),
            )
            return label
        return data["image/class/label"]

    streams = []
    for rank in range(ranks):
        begin, end = pipelines.shard_range(n, rank, ranks)
        want = 2 * (end - begin)
        pipe = ids(rank, batch_size=batch, num_threads=2, device_id=None, seed=rank)
        pipe.build()
        out = []
        while sum(len(x) for x in out) < want:
            (labels,) = pipe.run()
            out.append(np.asarray(labels.as_tensor()).reshape(-1))
        streams.append(np.concatenate(out)[:want])
        del pipe
    return streams


def run(quick: bool, tiny: bool = False) -> dict:
    """benchmarks.harness.results' contract: ImageNet-shaped (4 ranks); quick: 64,000 records, 64 shards, 1 rank; tiny: a smoke test."""
    from benchmarks.harness import results

    if results.is_tiny(tiny):
        sizes = (2000, 8, 2)
    else:
        sizes = (64000, 64, 1) if quick else (IMAGENET_TRAIN_EXAMPLES, 1024, 4)
    result = measure(*sizes, workdir=os.environ.get("TMPDIR"))
    results.write_result("shuffle", result)
    return result


def measure(
    records: int = IMAGENET_TRAIN_EXAMPLES, shards: int = 1024, ranks: int = 4, workdir: str | None = None
) -> dict:
    from data_tools.make_id_dataset import make_id_dataset

    with tempfile.TemporaryDirectory(dir=workdir) as d:
        make_id_dataset(d, train=records, train_shards=shards, size=1)
        result = {"records": records, "shards": shards, "ranks": ranks}
        for name, before in (("before", True), ("after", False)):
            result[name] = epoch_order_stats(reader_streams(d, ranks, before=before), records)
            print(f"{name}: {result[name]}", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_shuffle", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=IMAGENET_TRAIN_EXAMPLES)
    p.add_argument("--shards", type=int, default=1024)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--no-write", action="store_true", help="print only; keep benchmarks/results as it is")
    a = p.parse_args(argv)
    result = measure(a.records, a.shards, a.ranks, workdir=os.environ.get("TMPDIR"))
    if not a.no_write:
        from benchmarks.harness import results

        print(results.write_result("shuffle", result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
