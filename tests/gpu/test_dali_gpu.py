"""DALI on the GPU: the ``mixed`` decoder (nvJPEG) and GPU operators of each recipe's training pipeline, and the
hand-off of its batches to torch on the current CUDA stream (`vitlarge.data.loader`: ``feed_ndarray(...,
cuda_stream=...)``), which the CPU suite cannot reach: there the same lines take their CPU half.

Per recipe (its augmentation: random-resized or simple random crop, flip, RandAugment, 3-Augment, colour jitter),
on the demo digits shards: 200 batches on the GPU, consumed on a non-default stream, against the same recipe's
CPU pipeline. The record order does not depend on the device, so the labels are equal batch for batch; the
pixels differ by decoder and resize implementation (nvJPEG vs libjpeg-turbo, GPU vs CPU resampling) and by the
random draws of the GPU operators, so the images are compared by their statistics: the per-channel mean of the
normalised images within 0.05 and their standard deviation within 5% of the CPU pipeline's, over 200 batches.
The GPU loader's state (`TrainLoader.state`) resumes bitwise on the GPU, and a batch is whole when a step on a
non-default stream reads it straight after ``next(loader)``, with no host wait in between.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.gpu.conftest import needs
from tests.helpers import ROOT

pytestmark = needs("nvidia.dali", "the GPU data path is DALI's (this machine trains from data.source=synthetic only)")

RECIPES = ["vit_b16", "vit_b16_progressive", "vit_b16_ft384", "deit3_b16", "deit3_b16_ft224", "vit_h14"]
BATCHES = 200


def recipe_on_demo(recipe: str, demo_data: str, batch: int = 16):
    from vitlarge.config.load import load_recipe

    cfg = load_recipe(ROOT / "recipes" / f"{recipe}.py")
    cfg.data.path, cfg.data.num_classes = demo_data, 10
    cfg.data.image_size = min(cfg.data.image_size, 64)  # 8x8 digits: the operators run the same at any size
    cfg.data.label_offset = None
    cfg.train.micro_batch = batch
    cfg.train.phases = []
    return cfg


def stats(cfg, device: torch.device, stream=None) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Per-channel mean and std of ``BATCHES`` normalised batches (fp64 sums on the device), and the labels."""
    from vitlarge.data.sources import train_loader

    loader = train_loader(cfg, 0, 1, device)
    s1 = torch.zeros(3, dtype=torch.float64, device=device)
    s2 = torch.zeros(3, dtype=torch.float64, device=device)
    n, labels = 0, []
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        for _ in range(BATCHES):
            images, y = next(loader)
            assert images.device.type == device.type and images.dtype == torch.float32
            x = images.double()
            s1 += x.sum(dim=(0, 2, 3))
            s2 += (x * x).sum(dim=(0, 2, 3))
            n += x.numel() // 3
            labels.append(y)  # moved to the host after the loop: no sync per batch on the side stream
    labels = [y.cpu() for y in labels]
    mean = (s1 / n).cpu()
    std = (s2 / n - (s1 / n) ** 2).sqrt().cpu()
    return mean, std, labels


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_pipeline_on_the_gpu_matches_the_cpu_pipeline(recipe, demo_data, record_property):
    cfg = recipe_on_demo(recipe, demo_data)
    side = torch.cuda.Stream()
    g_mean, g_std, g_labels = stats(cfg, torch.device("cuda", 0), side)
    c_mean, c_std, c_labels = stats(cfg, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(g_labels, c_labels, strict=True)), "label order differs by device"
    assert torch.allclose(g_mean, c_mean, atol=0.05), (g_mean, c_mean)
    assert torch.allclose(g_std, c_std, rtol=0.05), (g_std, c_std)
    record_property(
        "shows",
        f"{BATCHES} batches, mixed decoder on a side stream: mean {g_mean.numpy().round(3)} vs CPU "
        f"{c_mean.numpy().round(3)}, std {g_std.numpy().round(3)} vs {c_std.numpy().round(3)}; labels equal",
    )


def test_gpu_loader_state_resumes_bitwise(demo_data, record_property):
    from vitlarge.data.sources import train_loader

    cfg = recipe_on_demo("deit3_b16", demo_data)
    gpu = torch.device("cuda", 0)
    first = train_loader(cfg, 0, 1, gpu)
    for _ in range(7):
        next(first)
    state = first.state()
    reference = [tuple(t.clone() for t in next(first)) for _ in range(5)]
    resumed = train_loader(cfg, 0, 1, gpu, state)
    again = [next(resumed) for _ in range(5)]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(reference, again, strict=True))
    record_property("shows", "7 batches, state(), 5 more == a loader built from that state, bitwise on the GPU")


def test_rectangular_validation_on_the_gpu_matches_the_cpu_pipeline(tmp_path, record_property):
    """``data.rect_val`` with the ``mixed`` decoder: the same graph with the device switched. On 64 images of the
    aspect-varied set (data_tools/make_aspect_dataset.py) at 16 px, 8 per chunk, 2 ranks: the same images in the
    same batches at the same rectangular shapes as the CPU pipeline's, pixels within decoder and resize rounding."""
    from data_tools.make_aspect_dataset import make_aspect_dataset
    from tests.helpers.loaders import open_val

    data = make_aspect_dataset(str(tmp_path), train=8, val=64).data_dir
    gpu, cpu, worst, shapes = torch.device("cuda", 0), torch.device("cpu"), 0.0, set()
    for rank in range(2):
        kw = dict(rank=rank, world_size=2, num_threads=2, rect_val=True, patch_size=4, crop_pct=0.875)
        on_gpu = list(open_val(data, 8, 16, device=gpu, **kw).masked())
        on_cpu = list(open_val(data, 8, 16, device=cpu, **kw).masked())
        for (g, gy, gk), (c, cy, ck) in zip(on_gpu, on_cpu, strict=True):
            assert g.device.type == "cuda" and g.shape == c.shape and gk == ck and torch.equal(gy.cpu(), cy)
            worst = max(worst, float((g.cpu() - c).abs().mean()))
            shapes.add(tuple(c.shape[2:]))
    assert len(shapes) > 4 and worst < 0.1, (shapes, worst)
    record_property("shows", f"{len(shapes)} crop shapes, labels and shapes equal; mean |GPU - CPU| <= {worst:.3f}")


SLEEP_CYCLES = 20_000_000  # ~10 ms at an H100's or H200's 1.98 GHz: the default stream is busy while a batch comes


def test_a_batch_is_whole_when_a_step_reads_it_on_a_side_stream(demo_data, record_property):
    """The hand-off DALI -> torch is ordered on torch's current stream: DALI's outputs are bound to it
    (``pipe.run(stream)``) and the copy into the torch tensor is queued on it (``feed_ndarray(cuda_stream=...)``).
    Here the current stream is a side stream, the default stream is kept busy before each batch (a copy or a wait
    queued there instead would not have run yet), and the "step" reads the batch on the side stream at once: its
    snapshot must equal, bit for bit, the same batches taken from a loader resumed at the same state and read only
    after the device finished."""
    from vitlarge.data.sources import train_loader

    cfg = recipe_on_demo("vit_b16", demo_data, batch=64)
    gpu = torch.device("cuda", 0)
    first = train_loader(cfg, 0, 1, gpu)
    next(first)
    state = first.state()
    reference = []
    for _ in range(20):
        images, labels = next(first)
        torch.cuda.synchronize()
        reference.append((images.clone(), labels.clone()))
    resumed = train_loader(cfg, 0, 1, gpu, state)
    side, default = torch.cuda.Stream(), torch.cuda.default_stream(gpu)
    read, kept = [], []
    with torch.cuda.stream(side):
        for _ in range(20):
            with torch.cuda.stream(default):
                torch.cuda._sleep(SLEEP_CYCLES)
            images, labels = next(resumed)
            read.append((images.clone(), labels.clone(), images.double().sum()))  # the step's first reads
            kept.append((images, labels))
    torch.cuda.synchronize()
    for (ref_x, ref_y), (x, y, total), (later_x, _) in zip(reference, read, kept, strict=True):
        assert torch.equal(ref_y, y), "labels differ from the reference loader's"
        assert torch.equal(ref_x, x), "the side stream read a batch that was not whole yet"
        assert torch.equal(later_x, ref_x) and total.item() == ref_x.double().sum().item()
    record_property(
        "shows",
        "20 batches of 64 at 64 px read on a side stream right after next(loader), the default stream busy "
        "~10 ms before each: bitwise equal to the same batches read after a device sync",
    )
