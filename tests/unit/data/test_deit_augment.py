"""vitlarge.data.deit_augment against DeiT's augment.py: the same decisions on the same pixels, real DALI.

DeiT III's transform (facebookresearch/deit, ``new_data_aug_generator``) runs on PIL images through
torchvision; the references are what torchvision calls on a PIL image, written out (so a reference does not
depend on torchvision's version; requirements.txt installs torchvision for benchmarks/bench_data.py only):
``Image.convert("L")`` for Grayscale(3), ``ImageOps.solarize``, ``ImageFilter.GaussianBlur``,
``ImageEnhance.Brightness/Contrast/Color`` for ColorJitter, ``np.pad(mode="reflect")`` for RandomCrop's
reflect padding. Each pixel op gets fixed decisions through ``external_source``; the random draws are
tested for their distribution; the loader tests run the whole training pipeline over TFRecords.
"""

from __future__ import annotations

import io
import itertools
import math
import os

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

from data_tools import tfrecord_io
from tests.helpers.loaders import open_train
from vitlarge.config.schema import Config
from vitlarge.data import TrainLoader
from vitlarge.data import deit_augment as da
from vitlarge.data.common import SettingsChanged
from vitlarge.data.manifest import Manifest, ShardInfo, shard_name, write_manifest
from vitlarge.data.sources import train_loader
from vitlarge.errors import UserError

CPU = torch.device("cpu")
RNG = np.random.default_rng(0)


def smooth_image(h: int, w: int) -> np.ndarray:
    """Photo-like content: low-frequency noise upsampled (bicubic)."""
    small = RNG.uniform(0, 255, (h // 4 + 2, w // 4 + 2, 3)).astype(np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC))


def noise_image(h: int, w: int) -> np.ndarray:
    return RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)


IMAGES = [smooth_image(40, 56) for _ in range(3)] + [noise_image(40, 56) for _ in range(3)]


def run_op(build, images, layout="HWC", **decisions):
    """Outputs of ``build(images, **decisions)`` in a CPU DALI pipeline; each decision is one value
    (an array) given to every sample. ``layout`` None: ``images`` are encoded files."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    names = sorted(decisions)

    @pipeline_def(enable_conditionals=True)
    def pipe():
        data = fn.external_source(name="images", layout=layout)
        args = {n: fn.external_source(name=n, dtype=types.INT32 if n in INT_DECISIONS else types.FLOAT) for n in names}
        return build(data, **args)

    p = pipe(
        batch_size=len(images),
        num_threads=1,
        device_id=None,
        seed=0,
        prefetch_queue_depth=1,
        exec_async=False,
        exec_pipelined=False,
    )
    p.build()
    p.feed_input("images", list(images))
    for n in names:
        dtype = np.int32 if n in INT_DECISIONS else np.float32
        p.feed_input(n, [np.asarray(decisions[n], dtype=dtype)] * len(images))
    (out,) = p.run()
    return [np.asarray(x) for x in out]


INT_DECISIONS = {"op", "order", "offsets"}


def diff(a, b) -> np.ndarray:
    return np.abs(np.asarray(a).astype(int) - np.asarray(b).astype(int))


def three_augment(images, op, radius):
    return run_op(da.three_augment, images, op=op, kernel=da.blur_kernel(radius))


def test_grayscale_equals_pils_within_one_level():
    for image, out in zip(IMAGES, three_augment(IMAGES, da.GRAYSCALE, 1.0)):
        ref = Image.fromarray(image).convert("L").convert("RGB")  # torchvision's Grayscale(3) on PIL
        assert out.shape == image.shape and diff(out, ref).max() <= 1  # PIL: fixed point; DALI: float


def test_solarize_equals_pils_exactly():
    for image, out in zip(IMAGES, three_augment(IMAGES, da.SOLARIZE, 1.0)):
        np.testing.assert_array_equal(out, np.asarray(ImageOps.solarize(Image.fromarray(image), 128)))


@pytest.mark.parametrize("radius", [0.1, 0.3, 0.7, 1.0, 1.37, 2.0])
def test_blur_equals_pils_gaussian_blur_of_the_same_radius(radius):
    """DALI convolves with PIL's kernel (`blur_kernel`) and rounds once, PIL rounds after each of its six
    box passes and repeats the edge pixel at each: measured at most 3 levels apart 6 pixels or more from
    the border and 8 at it (radius 2), 1.03 on average (radius 0.1)."""
    for i, (image, out) in enumerate(zip(IMAGES, three_augment(IMAGES, da.BLUR, radius))):
        pil = Image.fromarray(image)
        d = diff(out, pil.filter(ImageFilter.GaussianBlur(radius)))
        assert d[6:-6, 6:-6].max() <= 3 and d.max() <= 8 and d.mean() <= 1.1, (radius, d.max(), d.mean())
        if i < 3 or radius < 0.3:
            continue  # a blur this weak changes smooth images too little to tell scales apart
        for other in (radius * 1.5, radius / 1.5):  # the radius means PIL's radius, not another scale of it
            assert diff(out, pil.filter(ImageFilter.GaussianBlur(other))).mean() > d.mean() + 0.2


def test_blur_kernels_have_pils_variance():
    for radius in (0.1, 0.55, 1.0, 2.0):
        k = da.blur_kernel(radius)
        taps = np.arange(da.BLUR_TAPS) - da.BLUR_TAPS // 2
        assert k.shape == (da.BLUR_TAPS,) and abs(k.sum() - 1) < 1e-6 and np.allclose(k, k[::-1])
        assert abs((k * taps**2).sum() - radius**2) < 1e-4 * max(1, radius**2)
    table = da.blur_kernels()
    assert table.shape == (191, da.BLUR_TAPS)
    np.testing.assert_allclose(table[[0, -1]], [da.blur_kernel(0.1), da.blur_kernel(2.0)])


ENHANCE = {
    da.BRIGHTNESS: ImageEnhance.Brightness,
    da.CONTRAST: ImageEnhance.Contrast,
    da.SATURATION: ImageEnhance.Color,
}


@pytest.mark.parametrize("factors", [(1.3, 0.7, 1.2), (0.7, 1.3, 0.7), (0.75, 1.25, 1.29), (1.0, 1.0, 1.0)])
def test_jitter_equals_pil_enhance_in_each_order(factors):
    """torchvision's ColorJitter on a PIL image is ImageEnhance's Brightness, Contrast and Color in a
    random order, each rounded to uint8. PIL truncates where DALI rounds, and takes the contrast centre
    as a rounded integer: measured at most 4 levels apart, 1.6 on average (3 steps). Noise images clip,
    where the order matters (tens of levels), so a wrong order fails."""
    assert sorted(da.JITTER_ORDERS) == sorted(itertools.permutations(range(3)))
    for order, steps in enumerate(da.JITTER_ORDERS):
        outs = run_op(da.jitter, IMAGES, factors=factors, order=order)
        for image, out in zip(IMAGES, outs):
            ref = Image.fromarray(image)
            for step in steps:
                ref = ENHANCE[step](ref).enhance(factors[step])
            d = diff(out, ref)
            assert d.max() <= 4 and d.mean() <= 1.6, (factors, steps, d.max(), d.mean())


def test_jitter_order_matters_on_these_images():
    """The test above can tell orders apart: PIL's own results differ by far more than its tolerance."""
    image = Image.fromarray(IMAGES[-1])
    a = ImageEnhance.Contrast(ImageEnhance.Brightness(image).enhance(1.3)).enhance(0.7)
    b = ImageEnhance.Brightness(ImageEnhance.Contrast(image).enhance(0.7)).enhance(1.3)
    assert diff(a, b).max() > 20


def draws(build, batch_size: int = 1000, batches: int = 1):
    """``build()``'s outputs (a tuple of DataNodes) over ``batches`` runs, as arrays [N, ...] per output."""
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, seed=11)
    def pipe():
        return build()

    p = pipe()
    p.build()
    runs = [p.run() for _ in range(batches)]
    return [np.stack([np.asarray(x) for r in runs for x in r[i]]) for i in range(len(runs[0]))]


def within_binomial(count: int, n: int, p: float, sds: float = 5.0) -> bool:
    return abs(count - n * p) <= sds * math.sqrt(n * p * (1 - p))


def test_three_augment_draws_each_op_a_third_of_the_time_and_radii_uniform():
    op, kernel = draws(da.draw_three_augment, batches=2)
    n = len(op)
    for k in (da.GRAYSCALE, da.SOLARIZE, da.BLUR):
        assert within_binomial(int((op == k).sum()), n, 1 / 3), (k, (op == k).sum())
    assert set(np.unique(op)) == {0, 1, 2}
    taps = np.arange(da.BLUR_TAPS) - da.BLUR_TAPS // 2
    radius = np.sqrt((kernel * taps**2).sum(1))  # each kernel's standard deviation is its radius
    assert radius.min() > 0.1 - 1e-3 and radius.max() < 2.0 + 1e-3
    assert within_binomial(int((radius < 1.05).sum()), n, 0.5)  # the middle of 0.1..2.0
    assert within_binomial(int((radius < 0.575).sum()), n, 0.25)


def test_jitter_draws_are_colorjitters():
    factors, order = draws(lambda: da.draw_jitter(0.3), batches=2)
    n = len(order)
    assert factors.shape == (n, 3) and factors.min() >= 0.7 and factors.max() <= 1.3
    for k in range(3):  # independent uniforms on 0.7..1.3
        assert within_binomial(int((factors[:, k] < 1.0).sum()), n, 0.5)
    assert within_binomial(int(((factors[:, 0] < 1) & (factors[:, 1] < 1)).sum()), n, 0.25)
    for k in range(len(da.JITTER_ORDERS)):
        assert within_binomial(int((order == k).sum()), n, 1 / 6), (k, (order == k).sum())
    (big,) = draws(lambda: da.draw_jitter(1.5)[:1], batch_size=200)
    assert big.min() >= 0.0 and big.max() <= 2.5  # torchvision: max(0, 1 - s)


def position_image(h: int, w: int) -> np.ndarray:
    """Pixel (y, x) holds (y, x, (7y + x) mod 256): every output pixel names its source."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([y, x, (7 * y + x) % 256], -1).astype(np.uint8)


def png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("shape", [(40, 56), (56, 40), (37, 50), (32, 32), (300, 32)])
def test_src_size_is_torchvisions_resize_rule(shape):
    import nvidia.dali.types as types

    def build(_):
        return da.src_size(types.Constant(np.array([*shape, 3], dtype=np.int64)), 32)

    (out,) = [x for x in draws(lambda: build(None), batch_size=1)]
    short, long = min(shape), max(shape)
    expect = [32, int(32 * long / short)] if shape[0] == short else [int(32 * long / short), 32]
    assert out[0].tolist() == expect


def src_crop(images, offsets, size=32):
    """`src_crop` after decoding ``images`` from PNG, with fixed ``offsets``; also the resize target."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    def build(encoded, offsets):
        decoded = fn.decoders.image(encoded, output_type=types.RGB)
        resized = da.src_size(fn.peek_image_shape(encoded), size)
        return da.src_crop(decoded, resized, offsets, size, types.INTERP_CUBIC)

    encoded = [np.frombuffer(png(x), dtype=np.uint8) for x in images]
    return run_op(build, encoded, layout=None, offsets=offsets)


@pytest.mark.parametrize("offsets", [(0, 0), (8, 3), (4, 4), (2, 8), (8, 13)])
def test_src_crop_is_a_window_of_the_reflect_padded_image(offsets):
    """Images whose shorter side is already the size are not resized: exact pixels, padding included."""
    images = [position_image(32, 45), position_image(50, 32), position_image(32, 32)]
    for image, out in zip(images, src_crop(images, offsets)):
        top, left = offsets
        room = np.array(image.shape[:2]) + 8 - 32
        if top > room[0] or left > room[1]:
            continue  # outside RandomCrop's range for this shape
        padded = np.pad(image, ((4, 4), (4, 4), (0, 0)), mode="reflect")  # torchvision's "reflect"
        np.testing.assert_array_equal(out, padded[top : top + 32, left : left + 32])


def test_src_crop_resizes_the_shorter_side_as_pils_bicubic():
    """Larger images are resized (DALI's antialiased cubic against PIL's bicubic): measured at most
    8 levels apart (200 x 300 to 32 px), 0.35 on average."""
    images = [smooth_image(64, 96), smooth_image(80, 50), smooth_image(200, 300)]
    for image, out in zip(images, src_crop(images, (4, 4))):
        h, w = image.shape[:2]
        short = min(h, w)
        size = (int(32 * w / short), int(32 * h / short))
        ref = np.asarray(Image.fromarray(image).resize(size, Image.BICUBIC))
        d = diff(out, ref[:32, :32])
        assert d.max() <= 8 and d.mean() <= 0.5, (d.max(), d.mean())


def test_src_offsets_are_uniform_over_randomcrops_range():
    import nvidia.dali.types as types

    resized = types.Constant(np.array([32.0, 45.0], dtype=np.float32))
    (offsets,) = draws(lambda: (da.draw_src_offsets(resized, 32),), batch_size=1000)
    for axis, room in enumerate((8, 21)):  # (32 + 8 - 32), (45 + 8 - 32)
        counts = np.bincount(offsets[:, axis], minlength=room + 1)
        assert len(counts) == room + 1  # never past the range
        assert all(within_binomial(int(c), len(offsets), 1 / (room + 1)) for c in counts), counts


def write_image_dataset(out: str, images: list[np.ndarray]) -> str:
    """One train shard of PNG records (label = index) and a manifest; returns ``out``."""
    os.makedirs(out, exist_ok=True)
    name = shard_name("train", 0, 1)
    with tfrecord_io.ShardWriter(os.path.join(out, name)) as w:
        for i, image in enumerate(images):
            w.write(
                tfrecord_io.encode_example({"image/encoded": (png(image), "byte"), "image/class/label": (i, "int")})
            )
        done = w.commit()
    shards = [ShardInfo(name, name + ".idx", done.num_records, done.bytes, done.checksum)]
    m = Manifest(
        num_classes=len(images),
        label_offset=0,
        classes=[],
        splits={"train": shards},
        tool="tests.unit.data.test_deit_augment",
        tool_version="1.0.0",
        data_dir=out,
    )
    write_manifest(m, out)
    return out


def raw_loader(data_dir: str, **kw) -> TrainLoader:
    """Outputs in pixel values (mean 0, std 1), so a batch shows what the augmentation made."""
    return open_train(
        data_dir,
        100,
        32,
        rank=0,
        world_size=1,
        device=CPU,
        seed=5,
        mean=(0, 0, 0),
        std=(1 / 255,) * 3,
        num_threads=1,
        **kw,
    )


def test_loader_src_crops_and_flips_as_deit(tmp_path):
    """Through the TFRecord pipeline: every output is a window of the reflect-padded image, plain or
    mirrored, with the offsets and the flip as RandomCrop and RandomHorizontalFlip draw them."""
    image = position_image(32, 45)
    data = write_image_dataset(str(tmp_path / "pos"), [image])
    padded = np.pad(image, ((4, 4), (4, 4), (0, 0)), mode="reflect")
    loader = raw_loader(data, crop="src", initial_fill=1)
    tops, lefts, flips = [], [], []
    for _ in range(4):
        images, _ = next(loader)
        for out in images.permute(0, 2, 3, 1).numpy().astype(np.uint8):
            flipped = out[4, 0, 1] > out[4, -1, 1]  # column coordinates decrease
            plain = out[:, ::-1] if flipped else out
            top, left = int(plain[4, 4, 0]), int(plain[4, 4, 1])  # (4, 4) is never padding
            np.testing.assert_array_equal(plain, padded[top : top + 32, left : left + 32])
            tops.append(top), lefts.append(left), flips.append(flipped)
    n = len(tops)
    assert set(tops) == set(range(9)) and set(lefts) == set(range(22))
    assert within_binomial(sum(flips), n, 0.5)
    assert all(within_binomial(tops.count(t), n, 1 / 9) for t in range(9))


def test_loader_three_augment_picks_each_op_a_third_of_the_time(tmp_path):
    """A flat colour tells the ops apart: grayscale makes the channels equal, solarize inverts the
    channel >= 128, the blur leaves it as it is (crop and flip too)."""
    colour = (200, 30, 90)
    data = write_image_dataset(str(tmp_path / "flat"), [np.full((40, 48, 3), colour, np.uint8)])
    gray = int(np.asarray(Image.new("RGB", (1, 1), colour).convert("L"))[0, 0])
    expected = {"gray": (gray, gray, gray), "solarize": (55, 30, 90), "blur": colour}
    loader = raw_loader(data, crop="src", three_augment=True)
    seen = {k: 0 for k in expected}
    for _ in range(6):
        images, _ = next(loader)
        for out in images.numpy():
            pixel = tuple(int(round(float(c))) for c in out[:, 16, 16])
            name = next(k for k, v in expected.items() if max(abs(a - b) for a, b in zip(pixel, v)) <= 1)
            assert np.abs(out - np.array(expected[name])[:, None, None]).max() <= 1  # the whole image
            seen[name] += 1
    n = sum(seen.values())
    assert all(within_binomial(c, n, 1 / 3) for c in seen.values()), seen


def demo_config(demo_data: str) -> Config:
    cfg = Config()
    cfg.data.path, cfg.data.num_classes, cfg.data.image_size, cfg.data.num_threads = demo_data, 10, 32, 1
    cfg.data.three_augment, cfg.data.crop, cfg.data.color_jitter = True, "src", 0.3
    cfg.train.micro_batch = 32
    return cfg


def test_deit3_augmentation_loader_gives_normalized_batches_and_resumes_bitwise(demo_data):
    cfg = demo_config(demo_data)
    loader = train_loader(cfg, 0, 1, CPU)
    for _ in range(3):
        images, labels = next(loader)
        assert images.shape == (32, 3, 32, 32) and images.dtype == torch.float32
        assert torch.isfinite(images).all() and labels.shape == (32,)
    assert float(images.std()) > 0.1
    state = loader.state()
    expect = [next(loader) for _ in range(2)]
    restored = train_loader(cfg, 0, 1, CPU, state=state)
    for (a, la), (b, lb) in zip(expect, [next(restored) for _ in range(2)]):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_state_saved_with_other_augmentation_is_settings_changed(demo_data):
    cfg = demo_config(demo_data)
    state = train_loader(cfg, 0, 1, CPU).state()
    cfg.data.color_jitter = 0.4
    with pytest.raises(SettingsChanged):
        train_loader(cfg, 0, 1, CPU, state=state)


def test_src_padding_is_checked_only_for_the_simple_random_crop(demo_data):
    """A padding the image cannot reflect is refused for ``crop="src"`` and ignored for ``rrc`` (it is unused)."""
    with pytest.raises(UserError, match="src_padding=32"):
        open_train(demo_data, 8, 32, rank=0, world_size=1, device=CPU, seed=0, crop="src", src_padding=32)
    open_train(demo_data, 8, 32, rank=0, world_size=1, device=CPU, seed=0, crop="rrc", src_padding=32)


def test_train_interpolation_reaches_the_resize_and_the_resume_check(demo_data):
    """``data.train_interpolation=bicubic`` (DeiT's) resizes the same crops differently from bilinear's; a
    position saved under one is not continued under the other."""
    cfg = demo_config(demo_data)
    cfg.data.three_augment, cfg.data.color_jitter = False, 0.0
    cfg.data.image_size = 24  # the demo's JPEGs are 32 px: a resize happens
    bilinear = train_loader(cfg, 0, 1, CPU)
    state = bilinear.state()
    first, labels = next(bilinear)
    cfg.data.train_interpolation = "bicubic"
    bicubic, same_labels = next(train_loader(cfg, 0, 1, CPU))
    assert torch.equal(labels, same_labels)  # the same records and crops ...
    assert float((first - bicubic).abs().max()) > 0.05  # ... resized another way
    assert float((first - bicubic).abs().mean()) < 0.2
    with pytest.raises(SettingsChanged):
        train_loader(cfg, 0, 1, CPU, state=state)


@pytest.mark.parametrize(
    "kw, match", [({"crop": "center"}, "crop='center'"), ({"color_jitter": -0.1}, "color_jitter=-0.1")]
)
def test_loader_refuses_unknown_crop_and_negative_jitter(demo_data, kw, match):
    with pytest.raises(UserError, match=match):
        open_train(demo_data, 8, 32, rank=0, world_size=1, device=CPU, seed=0, **kw)
