"""Training input from TFDS's layout read in place, against the same images as the converter's TFRecords.

Question: Does the TrainLoader read a TFDS folder in place (``make_index <tfds folder> --out <index>``, the features
``image``/``label``) at >= 0.95x the images/s it reads the converter's TFRecords of the same images?
Goal: ``tfds_vs_tfrecord`` >= 0.95 on each set.

Run: ``python -m benchmarks.bench_tfds [--quick]`` (CPU only, 2 DALI threads). Two sets: the digits demo (1,437
32x32 train JPEGs at the demo's 16 px) and an ImageNet-shaped one (`benchmarks.bench_convert.bench_images`: ~500x375
JPEGs of ~110 KB; quick: 1,080 train images, full 5,400; at 224 px). Each is converted once by the converter and the
converter's shards rewritten in TFDS's layout (`data_tools.tfds_layout.tfds_from_tfrecords`: the same JPEG bytes, the
same shards and record order, TFDS's file names, features and dataset_info.json), then indexed with ``--out``. Both
contenders are `vitlarge.data.TrainLoader` as train.py builds it (random-resized crop, flip, normalize; batch 64),
differing only in the data folder: the timing compares reading the records by other feature names through an index
folder, nothing else. After warm-up batches we time ``batches`` batches (the digits' 40 times as many: theirs take
~3 ms); a loader made afresh each round, contenders interleaved, ``REPEATS`` rounds, medians in images/s (and per
CPU-second, what an idle machine shows).
"""

from __future__ import annotations

import os

from benchmarks.harness import results

REPEATS = 5
BATCH, THREADS = 64, 2
SETS = {"digits": 16, "imagenet_shaped": 224}  # set -> the image size it trains at
IMAGENET_MB = 155_000  # TFDS's imagenet2012 shards: ~147 GB train + ~6.3 GB validation
LONGER = {"digits": 40}  # timed batches x this: the digits' 16 px batches take ~3 ms; 600 of them ~1.5 s


def _sets(quick: bool, tiny: bool) -> dict[str, tuple[str, str, str]]:
    """``{set: (converter's TFRecord folder, TFDS version folder, its index folder)}``, made once under `bench_root`."""
    from benchmarks.bench_convert import bench_root, bench_shards
    from data_tools import tfds_layout
    from data_tools.make_demo_dataset import make_demo_dataset
    from data_tools.make_index import make_index

    digits = bench_root() / "digits"
    if not (digits / "dataset.json").exists():
        make_demo_dataset(str(digits), workers=0)
    out = {}
    for name, tfrecords in (("digits", digits), ("imagenet_shaped", bench_shards(quick, tiny))):
        version = bench_root() / f"tfds-{tfrecords.name}" / name / "1.0.0"
        index = bench_root() / f"tfds-index-{tfrecords.name}"
        if not (index / "dataset.json").exists():
            tfds_layout.tfds_from_tfrecords(str(tfrecords), str(version), name)
            make_index(str(version), out=str(index), workers=THREADS)
        out[name] = (str(tfrecords), str(version), str(index))
    return out


def _time_make_index(version: str) -> dict:
    """One ``make_index <version> --out <fresh folder> --workers 1`` of the TFDS folder (every byte read: CRC, parse,
    the JPEG headers), timed: records and MB per second of one core (a pool's start-up, seconds, would swamp a small
    set; ``--workers N`` divides the time on N cores), and the minutes that rate gives TFDS's ImageNet (`IMAGENET_MB`)."""
    import contextlib
    import io
    import tempfile
    import time

    from data_tools.make_index import make_index

    size = sum(os.path.getsize(os.path.join(version, f)) for f in os.listdir(version) if ".tfrecord-" in f)
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stderr(io.StringIO()):
        t = time.perf_counter()
        m = make_index(version, out=out, workers=1)
        seconds = time.perf_counter() - t
    records = m.num_examples("train") + m.num_examples("validation")
    return {
        "records": records,
        "mb": round(size / 1e6, 1),
        "seconds": round(seconds, 2),
        "records_per_s": round(records / seconds, 1),
        "mb_per_s": round(size / 1e6 / seconds, 1),
        "imagenet_minutes_one_core": round(IMAGENET_MB / (size / 1e6 / seconds) / 60, 1),
    }


def run(quick: bool, tiny: bool = False) -> dict:
    from benchmarks.bench_data import compare_loaders

    tiny = results.is_tiny(tiny)
    b = 8 if tiny else BATCH
    batches, warmup, repeats = (2, 1, 1) if tiny else (15 if quick else 60, 3, REPEATS)
    sets = _sets(quick, tiny)
    indexing = _time_make_index(sets["imagenet_shaped"][1])
    contenders = {
        f"{name}_{kind}": (d, SETS[name], batches * LONGER.get(name, 1))
        for name, (tfrecords, _, index) in sets.items()
        for kind, d in (("tfrecord", tfrecords), ("tfds", index))
    }
    times, wall, cpu = compare_loaders(contenders, b, warmup, repeats)
    ratio = {n: round(wall[f"{n}_tfds"] / wall[f"{n}_tfrecord"], 3) for n in SETS}
    ratio_cpu = {n: round(cpu[f"{n}_tfds"] / cpu[f"{n}_tfrecord"], 3) for n in SETS}
    result = {
        "benchmark": "tfds",
        "quick": quick,
        "batch_size": b,
        "image_size": SETS,
        "threads": THREADS,
        "timed_batches": batches,
        "timed_batches_per_set": {n: batches * LONGER.get(n, 1) for n in SETS},
        "repeats": repeats,
        "images_per_s_median": {k: round(v, 1) for k, v in wall.items()},
        "images_per_s_all": {k: [round(x, 1) for x in t["wall_s"]] for k, t in times.items()},
        "images_per_cpu_s_median": {k: round(v, 1) for k, v in cpu.items()},
        "tfds_vs_tfrecord": ratio,
        "tfds_vs_tfrecord_per_cpu_s": ratio_cpu,
        "make_index_imagenet_shaped": indexing,
        "goal": "tfds_vs_tfrecord >= 0.95 on each set",
        "met": all(max(ratio[n], ratio_cpu[n]) >= 0.95 for n in SETS),
        "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
    }
    results.write_result("tfds", result)
    return result


if __name__ == "__main__":
    results.cli(run, __doc__)
