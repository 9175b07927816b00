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


def grey16(values) -> Image.Image:
    """A 16-bit grey picture (PIL's I;16) holding ``values`` scaled to 16 bits: ``g * 257`` reads ``g`` at 8 bits."""
    return Image.fromarray(np.asarray(quadrants(values, "L")).astype(np.uint16) * 257)


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
    "grey16_png": (lambda: png(grey16(GREYS)), GREY),
    "grey16_png_exif6": (lambda: png(grey16(GREYS), 6), GREY),
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
    # re-encoded, in train and val each: 4 grey and 2 CMYK JPEGs, 6 PNGs
    assert "24 images re-encoded as RGB JPEG (6 of them transparent, composited on white: " in summary[0]
    assert os.path.join(src, "train", "la_png", "la_png.img") in summary[0]


def peeked_shape(data: bytes) -> tuple[int, int]:
    """DALI's ``peek_image_shape`` of ``data``: what the loaders and rectangular validation take for its size."""
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=1, num_threads=1, device_id=None, exec_async=False, exec_pipelined=False)
    def pipe():
        return fn.peek_image_shape(fn.external_source(source=[[np.frombuffer(data, dtype=np.uint8)]], cycle=True))

    p = pipe()
    p.build()
    (out,) = p.run()
    height, width, _ = np.array(out[0]).tolist()
    return height, width


def test_an_image_read_in_place_has_the_size_it_looks_as_converted(tmp_path):
    """Stored 40 wide, 20 high, orientation 6: 40 high, 20 wide as it looks, from the converter, DALI, and
    make_index's header read on a TFDS folder and on a WebDataset folder (their ``.sizes``, for rect_val)."""
    from data_tools import make_index
    from tests.helpers.data_fixtures import small_tfds
    from tests.helpers.wds_sets import write_timm_wds
    from vitlarge.data.manifest import split_sizes

    data = jpeg(Image.new("RGB", (20, 40), (200, 10, 10)), 6)
    converted = imagefolder.prepare_bytes(data, "turned")
    tfds = small_tfds(tmp_path / "tinynet" / "1.0.0", val_image=data)  # its third validation record
    wds = write_timm_wds(
        str(tmp_path / "wds"),
        {"train": 3, "validation": 2},
        edit=lambda s, i, x: {**x, "jpg": data} if s == "validation" and i == 0 else x,
    )
    for d in (tfds, wds):
        make_index.make_index(d, workers=1)
    sizes = {
        "converter": (converted.height, converted.width),
        "dali": peeked_shape(data),
        "tfds": tuple(split_sizes(load_manifest(tfds), "validation")[2]),
        "wds": tuple(split_sizes(load_manifest(wds), "validation")[0]),
        "header": imagefolder.displayed_header(data)[:2],
    }
    assert set(sizes.values()) == {(40, 20)}, sizes


@pytest.mark.parametrize("where", ["tfds", "wds"])
@pytest.mark.parametrize("mode", ["RGBA", "P"])
def test_a_transparent_image_read_in_place_is_one_line_naming_it_and_the_converter(tmp_path, capsys, where, mode):
    """DALI drops an alpha channel (a transparent drawing reads black on black), the converter composites it on
    white: read in place, a transparent image would train otherwise than it looks, so make_index refuses it."""
    from data_tools import make_index
    from tests.helpers.data_fixtures import small_tfds
    from tests.helpers.wds_sets import write_timm_wds

    data = png(alpha_drawing(mode))
    if where == "tfds":
        d, name = small_tfds(tmp_path / "tinynet" / "1.0.0", val_image=data), "v2.JPEG"
    else:
        swap = lambda s, i, x: (
            {**{k: v for k, v in x.items() if k != "jpg"}, "png": data} if s == "train" and i == 1 else x
        )  # noqa: E731
        d, name = write_timm_wds(str(tmp_path / "wds"), {"train": 3, "validation": 2}, edit=swap), "train_000001.png"
    rc = make_index.main([d, "--workers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert name in err[0] and "transparent" in err[0] and "data_tools.imagenet_to_tfrecord" in err[0], err[0]
    # the converter reads image folders and parquet, not tars or TFDS: the fix names what it converts
    assert "convert the set" not in err[0] and "ROOT/train/<class>/*" in err[0], err[0]
    assert not os.path.exists(os.path.join(d, "dataset.json"))


def docs_snippet(doc: str) -> str:
    """The lines of ``doc``'s inference snippet that make an image as trained, from its ``exif_transpose`` line to
    the one that converts it to RGB (``image = ...convert("RGB")``), the path and what follows left out."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "..", doc)) as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if "ImageOps.exif_transpose(Image.open(" in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("image = "))
    return "\n".join(lines[start + 1 : end])


def test_the_docs_snippet_reads_each_kind_as_the_converter_does(tmp_path):
    """The snippet users classify with outside vitlarge (README, RECIPES.md, DATA.md: the same lines) gives each
    kind as it looks, and the converter's picture pixel for pixel (both PIL): a 16-bit grey PNG read white in both
    before."""
    from PIL import ImageOps

    snippets = {doc: docs_snippet(doc) for doc in ("README.md", "docs/RECIPES.md", "docs/DATA.md")}
    assert len(set(snippets.values())) == 1, snippets
    body = snippets["docs/DATA.md"]
    wrong = {}
    for name, (make, colours) in KINDS.items():
        scope = {"Image": Image, "image": ImageOps.exif_transpose(Image.open(io.BytesIO(make())))}
        exec(body, scope)  # noqa: S102 (the docs' own lines, run as users run them)
        got = np.asarray(scope["image"].convert("RGB"))
        converter, _ = imagefolder.upright_rgb(Image.open(io.BytesIO(make())))
        q = SIDE // 4
        centres = [tuple(int(v) for v in got[r * 2 * q + q, c * 2 * q + q]) for r, c in QUADRANTS]
        if not np.array_equal(got, np.asarray(converter)) or any(
            abs(a - b) > TOLERANCE for g, e in zip(centres, colours) for a, b in zip(g, e)
        ):
            wrong[name] = (centres, colours)
    assert not wrong, f"the docs' snippet reads these otherwise than they look or the converter reads them: {wrong}"


def test_a_turned_tiffs_header_size_is_the_size_it_is_converted_at():
    """PIL reports a TIFF's size already turned by its orientation tag (and turns it on load): the header read
    (the converter's validation sort) must not turn it a second time. Stored 40 wide, 20 high, orientation 6."""
    pixels, exif = stored(Image.new("RGB", (20, 40), (200, 10, 10)), 6)
    out = io.BytesIO()
    pixels.save(out, "TIFF", exif=exif)
    converted = imagefolder.prepare_bytes(out.getvalue(), "turned.tif")
    assert (converted.height, converted.width) == (40, 20)
    assert imagefolder.displayed_header(out.getvalue())[:2] == (40, 20)
    assert peeked_shape(out.getvalue()) == (40, 20)
