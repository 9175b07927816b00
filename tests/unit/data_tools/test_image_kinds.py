"""Every image kind is trained as it looks: each kind made with PIL, converted, then read through the real DALI
validation loader and compared with the upright, opaque picture (`data_tools.imagefolder.upright_rgb`'s rule).

Each source stores a 64 x 64 picture of four coloured quadrants so that, once its EXIF orientation is applied, it
shows the same picture (`CANON`); a transparent one holds its drawing in the alpha channel (top-left quadrant
opaque black, the rest transparent: white once composited). The loader's centre crop keeps each quadrant's centre.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from data_tools import imagefolder, imagenet_to_tfrecord
from tests.helpers import call_main
from tests.helpers.loaders import open_val
from vitlarge.data.manifest import load_manifest

SIDE = 64
QUADRANTS = ((0, 0), (0, 1), (1, 0), (1, 1))  # (row, column) halves
COLOURS = ((220, 30, 30), (30, 200, 40), (40, 60, 220), (240, 220, 40))
GREYS = (30, 100, 170, 240)
# The inverse of what each EXIF orientation asks the viewer to do (PIL's exif_transpose does the forward one).
INVERSE = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def quadrants(values, mode: str = "RGB") -> Image.Image:
    h = SIDE // 2
    a = np.zeros((SIDE, SIDE, 3) if mode == "RGB" else (SIDE, SIDE), np.uint8)
    for (r, c), v in zip(QUADRANTS, values):
        a[r * h : (r + 1) * h, c * h : (c + 1) * h] = v
    return Image.fromarray(a, mode)


def stored(im: Image.Image, orientation: int) -> tuple[Image.Image, bytes | None]:
    """(the pixels to store, the EXIF block) that show ``im`` once ``orientation`` is applied."""
    if orientation == 1:
        return im, None
    exif = Image.Exif()
    exif[imagefolder.EXIF_ORIENTATION] = orientation
    return im.transpose(INVERSE[orientation]), exif.tobytes()


def jpeg(im: Image.Image, orientation: int = 1) -> bytes:
    pixels, exif = stored(im, orientation)
    out = io.BytesIO()
    pixels.save(out, "JPEG", quality=95, **({"exif": exif} if exif else {}))
    return out.getvalue()


def png(im: Image.Image, orientation: int = 1) -> bytes:
    pixels, exif = stored(im, orientation)
    out = io.BytesIO()
    pixels.save(out, "PNG", **({"exif": exif} if exif else {}))
    return out.getvalue()


def alpha_drawing(mode: str) -> Image.Image:
    """Black ink everywhere; only the top-left quadrant opaque: the drawing is the alpha channel."""
    alpha = quadrants((255, 0, 0, 0), "L")
    if mode == "P":  # a palette image whose colour 1 is transparent
        p = Image.new("P", (SIDE, SIDE), 1)
        p.putpalette([0, 0, 0, 0, 0, 0] + [0] * 762)
        p.paste(0, (0, 0, SIDE // 2, SIDE // 2))
        p.info["transparency"] = 1
        return p
    base = Image.new("RGB" if mode == "RGBA" else "L", (SIDE, SIDE), 0)
    base.putalpha(alpha)
    return base


BLACK, WHITE = (0, 0, 0), (255, 255, 255)
INK = (BLACK, WHITE, WHITE, WHITE)  # the alpha drawing composited on white
RGB = COLOURS
GREY = tuple((g, g, g) for g in GREYS)
CMYK_RGB = tuple(Image.new("CMYK", (1, 1), Image.new("RGB", (1, 1), c).convert("CMYK").getpixel((0, 0))).convert("RGB").getpixel((0, 0)) for c in COLOURS)  # fmt: skip

# name -> (file bytes, the quadrants' colours as the image looks)
KINDS = {
    "rgb_jpeg": (lambda: jpeg(quadrants(COLOURS)), RGB),
    "rgb_jpeg_exif6": (lambda: jpeg(quadrants(COLOURS), 6), RGB),
    "rgb_jpeg_exif3": (lambda: jpeg(quadrants(COLOURS), 3), RGB),
    "grey_jpeg": (lambda: jpeg(quadrants(GREYS, "L")), GREY),
    "grey_jpeg_exif6": (lambda: jpeg(quadrants(GREYS, "L"), 6), GREY),
    "grey_jpeg_exif8": (lambda: jpeg(quadrants(GREYS, "L"), 8), GREY),
    "grey_jpeg_exif5": (lambda: jpeg(quadrants(GREYS, "L"), 5), GREY),
    "cmyk_jpeg": (lambda: jpeg(quadrants(COLOURS).convert("CMYK")), CMYK_RGB),
    "cmyk_jpeg_exif6": (lambda: jpeg(quadrants(COLOURS).convert("CMYK"), 6), CMYK_RGB),
    "rgb_png_exif8": (lambda: png(quadrants(COLOURS), 8), RGB),
    "rgba_png": (lambda: png(alpha_drawing("RGBA")), INK),
    "la_png": (lambda: png(alpha_drawing("LA")), INK),
    "p_png": (lambda: png(alpha_drawing("P")), INK),
}
TRANSPARENT = {"rgba_png", "la_png", "p_png"}
TOLERANCE = 24  # JPEG's loss at a quadrant's centre, re-encoded at most once, after the loader's resize


@pytest.fixture(scope="module")
def kinds_converted(tmp_path_factory) -> tuple[str, str]:
    """(source tree, converted folder): one class per kind, the same image in train and val."""
    src = tmp_path_factory.mktemp("kinds_src")
    for name, (make, _) in KINDS.items():
        data = make()
        for split in ("train", "val"):
            os.makedirs(src / split / name)
            (src / split / name / f"{name}.img").write_bytes(data)
    out = str(tmp_path_factory.mktemp("kinds_out"))
    imagenet_to_tfrecord.convert(str(src), out, workers=0, progress=False, min_class_images=1)
    return str(src), out


def test_each_kind_reads_through_dali_as_it_looks(kinds_converted):
    _, out = kinds_converted
    classes = [c.synset for c in load_manifest(out).classes]
    seen = {}
    # crop_pct 1: the shorter side to 64, the whole 64 x 64 picture; mean 0, std 1/255: pixels back as 0..255
    for x, y in open_val(out, 4, SIDE, crop_pct=1.0, mean=(0, 0, 0), std=(1 / 255,) * 3):
        for image, label in zip(x, y.tolist()):
            seen[classes[label]] = image.permute(1, 2, 0).numpy()
    assert sorted(seen) == sorted(KINDS)
    wrong = {}
    for name, (_, colours) in KINDS.items():
        q = SIDE // 4
        got = [tuple(int(v) for v in seen[name][r * 2 * q + q, c * 2 * q + q]) for r, c in QUADRANTS]
        if any(abs(a - b) > TOLERANCE for g, e in zip(got, colours) for a, b in zip(g, e)):
            wrong[name] = (got, colours)
    assert not wrong, f"read otherwise than they look (got, expected): {wrong}"


def test_kept_jpegs_keep_their_bytes_and_tag_and_the_sizes_are_as_the_image_looks(tmp_path):
    """A colour JPEG keeps its bytes, orientation tag included (DALI applies it); the size recorded is the
    displayed one (what ``peek_image_shape`` and rectangular validation see): stored 40 wide and 20 high, turned a
    quarter, it is 20 wide and 40 high, kept or re-encoded."""
    tall = Image.new("RGB", (20, 40), (200, 10, 10))  # as it looks; stored 40 wide, 20 high
    for kind, data in (("rgb", jpeg(tall, 6)), ("grey", jpeg(tall.convert("L"), 6))):
        image = imagefolder.prepare_bytes(data, kind)
        assert (image.height, image.width) == (40, 20), kind
        assert image.reencoded == (kind == "grey")
        if kind == "rgb":
            assert image.data == data and imagefolder.jpeg_orientation(image.data) == 6
        else:  # turned here, once: no tag left for a second turn
            assert imagefolder.jpeg_orientation(image.data) == 1
            assert Image.open(io.BytesIO(image.data)).size == (20, 40)


def test_the_summary_counts_and_names_the_transparent_images(kinds_converted, tmp_path):
    src, _ = kinds_converted
    args = [
        "--src",
        src,
        "--out",
        str(tmp_path / "again"),
        "--workers",
        "0",
        "--no-progress",
        "--min-class-images",
        "1",
    ]
    done = call_main("data_tools.imagenet_to_tfrecord", *args)
    assert done.returncode == 0, done.stderr
    summary = [line for line in done.stderr.splitlines() if line.startswith("wrote ")]
    assert len(summary) == 1
    # re-encoded, in train and val each: 4 grey and 2 CMYK JPEGs, 4 PNGs
    assert "20 images re-encoded as RGB JPEG (6 of them transparent, composited on white: " in summary[0]
    assert os.path.join(src, "train", "la_png", "la_png.img") in summary[0]
