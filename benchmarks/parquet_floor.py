"""The least a copy of a parquet set's images through pyarrow and Python costs: ``benchmarks.bench_parquet``'s
``pyarrow floor`` contender, the floor under ``imagenet_to_tfrecord --src <parquet folder>``.

    python -m benchmarks.parquet_floor SRC OUT [--workers N]

Each parquet file under ``SRC/data`` is read as the converter reads one (pyarrow, `READ_ROWS` rows a batch,
the image and label columns, each image's bytes copied into Python once), every image's bytes get the two
CRC32Cs the converter computes (its record's and its shard's) and are written to one file per parquet file
under ``OUT``, which is fsynced; ``N`` worker processes (forked) take the files. Left out, to be a floor: the
TFRecord framing, the JPEG header checks, the shuffle, the validation split's aspect order, the DALI index and
the done-records.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys

READ_ROWS = 32  # data_tools.parquet_source.READ_ROWS


def copy_file(src: str, out: str) -> int:
    """Copy ``src``'s image bytes to ``out`` as described above; the bytes written."""
    import crc32c
    import pyarrow.parquet as pq

    written = 0
    pf = pq.ParquetFile(src, memory_map=False)
    columns = pf.schema_arrow.names[:2]
    with open(out, "wb") as f:
        for batch in pf.iter_batches(READ_ROWS, columns=columns, use_threads=False):
            for value in batch.column(0).field("bytes").to_pylist():
                crc32c.crc32c(value, crc32c.crc32c(value))
                written += f.write(value)
        f.flush()
        os.fsync(f.fileno())
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parquet_floor", description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)
    data = os.path.join(a.src, "data")
    files = sorted(f for f in os.listdir(data) if f.endswith(".parquet"))
    os.makedirs(a.out, exist_ok=True)
    jobs = [(os.path.join(data, f), os.path.join(a.out, f + ".bytes")) for f in files]
    with mp.get_context("fork").Pool(a.workers) as pool:
        written = sum(pool.starmap(copy_file, jobs, chunksize=1))
    print(f"{written:,} image bytes from {len(files)} files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
