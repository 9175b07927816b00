"""Training images/s from WebDataset tars read in place against the same images as TFRecords.

Question: Does the TrainLoader read a WebDataset set in timm's layout (DALI's webdataset reader, the tars where
they are) at >= 0.95x the images/s of the same images converted to TFRecords?
Goal: ``webdataset_vs_tfrecord`` >= 0.95 on both sets (or its per-CPU-second form).

Run: ``python -m benchmarks.bench_wds [--quick]`` (CPU, 2 DALI threads). Two sets, each as TFRecords and as
their WebDataset copy (`data_tools.make_wds_copy`: the same records, tar for shard, indexed by make_index):
the digits demo (1,437 32x32 JPEGs, the demo recipe's 32-pixel crops, batch 64) and the ImageNet-shaped set of
`benchmarks.bench_data` (``data_tools.make_bench_dataset``: ~62 KB ~500x375 JPEGs, 224-pixel crops, batch 64;
quick: 1,080 train images, full: 5,400). The contenders are `vitlarge.data.TrainLoader` as the trainer uses it,
one per format, interleaved, ``REPEATS`` times; medians in images/s. Writes ``benchmarks/results/wds.json``.
"""

from __future__ import annotations

import os

from benchmarks.harness import results

REPEATS = 3
BATCH, THREADS = 64, 2


def _sets(quick: bool, tiny: bool) -> dict[str, tuple[str, str, int]]:
    """``{set: (TFRecord folder, WebDataset folder, image size)}``, made once under the benchmarks' data folder."""
    from benchmarks.bench_convert import bench_root, bench_shards
    from data_tools.make_demo_dataset import make_demo_dataset
    from data_tools.make_index import make_index
    from data_tools.make_wds_copy import make_wds_copy

    digits = bench_root() / "digits"
    make_demo_dataset(str(digits))
    out = {"digits": (str(digits), 32), "imagenet_shaped": (str(bench_shards(quick, tiny)), 224)}
    sets = {}
    for name, (tfrecord, size) in out.items():
        wds = tfrecord + "-wds"
        if not os.path.exists(os.path.join(wds, "dataset.json")):
            make_index(make_wds_copy(tfrecord, wds, name=name), workers=1)
        sets[name] = (tfrecord, wds, size)
    return sets


def run(quick: bool, tiny: bool = False) -> dict:
    from benchmarks.bench_data import compare_loaders

    tiny = results.is_tiny(tiny)
    b = 8 if tiny else BATCH
    batches, warmup, repeats = (2, 1, 1) if tiny else (15 if quick else 60, 3, REPEATS)
    contenders = {
        f"{name}/{fmt}": (d, size, batches)
        for name, (tfrecord, wds, size) in _sets(quick, tiny).items()
        for fmt, d in (("tfrecord", tfrecord), ("webdataset", wds))
    }
    times, med, med_cpu = compare_loaders(contenders, b, warmup, repeats)
    sets = sorted({k.split("/")[0] for k in med})
    result = {
        "benchmark": "wds",
        "quick": quick,
        "batch_size": b,
        "threads": THREADS,
        "timed_batches": batches,
        "repeats": repeats,
        "images_per_s_median": {k: round(v, 1) for k, v in med.items()},
        "images_per_s_all": {k: [round(x, 1) for x in t["wall_s"]] for k, t in times.items()},
        "images_per_cpu_s_median": {k: round(v, 1) for k, v in med_cpu.items()},
        "webdataset_vs_tfrecord": {s: round(med[f"{s}/webdataset"] / med[f"{s}/tfrecord"], 3) for s in sets},
        "webdataset_vs_tfrecord_per_cpu_s": {
            s: round(med_cpu[f"{s}/webdataset"] / med_cpu[f"{s}/tfrecord"], 3) for s in sets
        },
        "goal": "webdataset >= 0.95x tfrecord images/s",
        "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
    }
    results.write_result("wds", result)
    return result


if __name__ == "__main__":
    results.cli(run, __doc__)
