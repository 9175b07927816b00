"""Training-input throughput on the CPU: our DALI TrainLoader vs torchvision, and DALI variants.

Question: Does the DALI TrainLoader feed the training loop at least twice as fast as torchvision's
DataLoader?
Goal: ``trainloader_vs_torchvision`` (or its per-CPU-second form) >= 2.

Run: ``python -m benchmarks.bench_data [--quick]`` (CPU only, 2 DALI threads / 2 DataLoader
workers; quick: 1,080 ImageNet-like train JPEGs (~62 KB, ~500x375), ~2 min; full: 5,400).
Writes ``benchmarks/results/data.json``. Every contender produces 224x224 float CHW batches of
64 with random-resized-crop (0.08-1 area, 3/4-4/3 ratio), horizontal flip and normalization.
After warm-up batches we time ``batches`` batches; each contender runs ``REPEATS`` times,
interleaved, and we report medians in images/s.

Contenders:
- ``dali_trainloader``: ``vitlarge.data.TrainLoader`` as the trainer uses it (into torch tensors).
- ``dali_before_tuning``: the first version: ROI decode, then ``fn.resize`` with DALI's default
  antialiasing, then crop_mirror_normalize.
- ``dali_trainloader_nearest``: the same with ``interpolation="nearest"`` (the fast CPU option).
- ``dali_*`` variants: raw pipelines, one change each (antialiasing, interpolation, full decode +
  ``random_resized_crop``, prefetch depth), to show what mattered.
- ``dali_decode_only``: reader + full-image decode and nothing else: the ceiling.
- ``torchvision``: ``ImageFolder`` + ``RandomResizedCrop`` + flip + ``ToTensor`` + ``Normalize``,
  ``DataLoader(num_workers=2)`` over the same JPEGs.
Goal: ``dali_trainloader`` >= 2x ``torchvision``.
"""

from __future__ import annotations

import os
import statistics
import time

from benchmarks.harness import results, timing

REPEATS = 3
BATCH, SIZE, THREADS = 64, 224, 2


def _dali_variant(
    data_dir: str,
    batch: int,
    *,
    decode: str = "roi",
    antialias: bool = False,
    interp: str = "linear",
    prefetch: int = 2,
    augment: bool = True,
):
    """A raw DALI pipeline with one knob changed from the library's train pipeline."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    from vitlarge.data.loader import DEFAULT_MEAN, DEFAULT_STD
    from vitlarge.data.manifest import load_manifest, shard_files
    from vitlarge.data.pipelines import FEATURES

    files = shard_files(load_manifest(data_dir), "train")
    interp_type = {"linear": types.INTERP_LINEAR, "triangular": types.INTERP_TRIANGULAR, "nn": types.INTERP_NN}[interp]

    @pipeline_def(batch_size=batch, num_threads=THREADS, device_id=None, seed=0, prefetch_queue_depth=prefetch)
    def pipe():
        data = fn.readers.tfrecord(
            path=[f for f, _ in files],
            index_path=[i for _, i in files],
            features=FEATURES,
            random_shuffle=True,
            initial_fill=1024,
            stick_to_shard=True,
        )
        jpegs = data["image/encoded"]
        if decode == "only":
            return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        if decode == "full":
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.random_resized_crop(
                images,
                size=[SIZE, SIZE],
                random_area=[0.08, 1.0],
                random_aspect_ratio=[0.75, 4 / 3],
                antialias=antialias,
                interp_type=interp_type,
            )
        else:
            images = fn.decoders.image_random_crop(
                jpegs, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0], random_aspect_ratio=[0.75, 4 / 3]
            )
            images = fn.resize(images, size=[SIZE, SIZE], antialias=antialias, interp_type=interp_type)
        return fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=list(DEFAULT_MEAN),
            std=list(DEFAULT_STD),
            mirror=fn.random.coin_flip(),
        )

    p = pipe()
    p.build()
    return p.run


def _trainloader(data_dir: str, batch: int, interpolation: str = "bilinear", size: int = SIZE):
    import torch

    from vitlarge.data import TrainLoader, TrainSpec

    spec = TrainSpec(
        data_dir,
        batch,
        size,
        seed=0,
        num_threads=THREADS,
        initial_fill=1024,
        interpolation=interpolation,
    )
    loader = TrainLoader(spec, rank=0, world_size=1, device=torch.device("cpu"))
    return lambda: next(loader)


def _torchvision(image_root: str, batch: int):
    import torch
    from torchvision import datasets, transforms

    from vitlarge.data.loader import DEFAULT_MEAN, DEFAULT_STD

    tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(SIZE),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize([m / 255 for m in DEFAULT_MEAN], [s / 255 for s in DEFAULT_STD]),
        ]
    )
    ds = datasets.ImageFolder(os.path.join(image_root, "train"), tf)
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=batch,
        shuffle=True,
        num_workers=THREADS,
        drop_last=True,
        persistent_workers=True,
        prefetch_factor=2,
    )
    state = {"it": iter(dl)}

    def step():
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(dl)
            return next(state["it"])

    return step


def _cpu_seconds() -> float:
    """CPU time of this process (all DALI threads) plus its live children (DataLoader workers)."""
    total = time.process_time()
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                t = child.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    except ImportError:
        pass
    return total


def _measure(step, batch: int, batches: int, warmup: int = 3) -> tuple[float, float]:
    """(images per wall second, images per CPU second) over ``batches`` batches after warm-up."""
    for _ in range(warmup):
        step()
    t, c = time.perf_counter(), _cpu_seconds()
    for _ in range(batches):
        step()
    images = batches * batch
    return images / (time.perf_counter() - t), images / max(_cpu_seconds() - c, 1e-9)


def compare_loaders(contenders: dict[str, tuple[str, int, int]], batch: int, warmup: int, repeats: int):
    """`vitlarge.data.TrainLoader` as the trainer uses it (`_trainloader`) on each contender ``{key: (data folder,
    image size, batches timed)}``, interleaved ``repeats`` times (`timing.interleaved_wall_cpu`), torch on one
    thread (the main process only copies; the cores go to the pipelines): ``(timings, median images per wall
    second, median images per CPU second)``, each by key."""
    import torch

    torch.set_num_threads(1)
    runs = {
        k: lambda d=d, s=s, n=n: _measure(_trainloader(d, batch, size=s), batch, n, warmup)
        for k, (d, s, n) in contenders.items()
    }
    times = timing.interleaved_wall_cpu(runs, repeats)
    wall = {k: statistics.median(t["wall_s"]) for k, t in times.items()}
    cpu = {k: statistics.median(t["cpu_s"]) for k, t in times.items()}
    return times, wall, cpu


def run(quick: bool, tiny: bool = False) -> dict:
    import torch

    from benchmarks.bench_convert import bench_images, bench_shards

    tiny = results.is_tiny(tiny)
    torch.set_num_threads(1)  # the main process only copies; leave the cores to the pipelines
    image_root, _ = bench_images(quick, tiny)
    data_dir = str(bench_shards(quick, tiny))
    # tiny: two timed batches of 8 after one warm-up, once (the smoke test's sizes).
    b = 8 if tiny else BATCH
    batches, warmup, repeats = (2, 1, 1) if tiny else (15 if quick else 60, 3, REPEATS)
    contenders = {
        "dali_trainloader": lambda: _trainloader(data_dir, b),
        "dali_trainloader_nearest": lambda: _trainloader(data_dir, b, "nearest"),
        "dali_before_tuning": lambda: _dali_variant(data_dir, b, antialias=True),
        "dali_roi_linear_noaa": lambda: _dali_variant(data_dir, b),
        "dali_roi_nearest": lambda: _dali_variant(data_dir, b, interp="nn"),
        "dali_fulldecode_random_resized_crop": lambda: _dali_variant(data_dir, b, decode="full"),
        "dali_prefetch1": lambda: _dali_variant(data_dir, b, prefetch=1),
        "dali_prefetch3": lambda: _dali_variant(data_dir, b, prefetch=3),
        "dali_decode_only": lambda: _dali_variant(data_dir, b, decode="only"),
        "torchvision": lambda: _torchvision(str(image_root), b),
    }
    # A contender's pipeline is made afresh each round and dropped after it (its threads with it).
    times = timing.interleaved_wall_cpu(
        {name: (lambda m=make: _measure(m(), b, batches, warmup)) for name, make in contenders.items()}, repeats
    )
    wall = {k: t["wall_s"] for k, t in times.items()}  # images/s here, not seconds
    cpu = {k: t["cpu_s"] for k, t in times.items()}
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    result = {
        "benchmark": "data",
        "quick": quick,
        "batch_size": b,
        "image_size": SIZE,
        "threads_or_workers": THREADS,
        "timed_batches": batches,
        "repeats": repeats,
        "images_per_s_median": {k: round(v, 1) for k, v in med.items()},
        "images_per_s_all": {k: [round(x, 1) for x in v] for k, v in wall.items()},
        # Throughput per CPU-second is what 2 dedicated cores would give (x2), independent of
        # other load on a shared machine; wall-clock figures are only as good as the machine was idle.
        "images_per_cpu_s_median": {k: round(v, 1) for k, v in med_cpu.items()},
        "trainloader_vs_torchvision": round(med["dali_trainloader"] / med["torchvision"], 2),
        "trainloader_vs_torchvision_per_cpu_s": round(med_cpu["dali_trainloader"] / med_cpu["torchvision"], 2),
        "before_tuning_vs_torchvision": round(med["dali_before_tuning"] / med["torchvision"], 2),
        "before_tuning_vs_torchvision_per_cpu_s": round(med_cpu["dali_before_tuning"] / med_cpu["torchvision"], 2),
        "trainloader_nearest_vs_torchvision_per_cpu_s": round(
            med_cpu["dali_trainloader_nearest"] / med_cpu["torchvision"], 2
        ),
        "trainloader_pct_of_decode_only": round(100 * med["dali_trainloader"] / med["dali_decode_only"], 1),
        "trainloader_pct_of_decode_only_per_cpu_s": round(
            100 * med_cpu["dali_trainloader"] / med_cpu["dali_decode_only"], 1
        ),
        "goal": "dali_trainloader >= 2x torchvision",
        "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
    }
    results.write_result("data", result)
    return result


if __name__ == "__main__":
    results.cli(run, __doc__)
