"""The least a copy of a parquet set's images through pyarrow and Python costs: ``benchmarks.bench_parquet``'s
``pyarrow floor`` contender, the floor under ``imagenet_to_tfrecord --src <parquet folder>``.

    python -m benchmarks.parquet_floor SRC OUT [--workers N]

Each parquet file under ``SRC/data`` is read with the converter's own reader (`data_tools.parquet_source.Reader`:
the data set's image and label columns, row group by row group, plain or dictionary-encoded as the file stores
them), every image's bytes get the two CRC32Cs the converter computes (its record's and its shard's) and are
written to one file per parquet file under ``OUT``, which is fsynced; ``N`` worker processes (forked) take the
files. Left out, to be a floor: the TFRecord framing, the JPEG header checks, the shuffle, the validation split's
aspect order, the DALI index and the done-records.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys


def copy_file(src: str, out: str) -> int:
    """Copy ``src``'s image bytes to ``out`` as described above; the bytes written."""
    import crc32c

    from data_tools.parquet_source import Reader, _py

    written = 0
    reader = Reader(src)
    with open(out, "wb") as f:
        for group in range(reader.plain.metadata.num_row_groups):
            for data, _, _ in reader.rows(group):
                value = _py(data) or b""
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
