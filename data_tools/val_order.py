"""The order the converter writes the validation split in: by aspect ratio (width / height).

Rectangular validation (``data.rect_val``, `vitlarge.data.rect`) crops each batch of consecutive records to
its mean aspect ratio, which cuts little of each image only where a batch holds images of one shape:
fast.ai's imagenet18 sorts ImageNet's validation images so (its ``imagenet-data-sorted``). The order costs
the square crop nothing (it counts every image once, in any order), so the converter always writes it:
a data set converted once serves both crops. Sorting needs each image's size before the shards are
planned: `aspect_sorted` reads it from the file's header (PIL parses the header only: 1.2 ms an image from
the page cache on a loaded 2-core AMD EPYC, about a minute for ImageNet's 50,000). The size recorded in ``dataset.json`` is
the one the shard writer reads again, of the bytes it writes (`data_tools.imagefolder.prepare_image`).
"""

from __future__ import annotations

from fractions import Fraction

from PIL import Image

from vitlarge.fileio import open_regular

from .imagefolder import DEFAULT_MAX_IMAGE_PIXELS, Item, displayed_header


def header_size(image: str | bytes, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[int, int] | None:
    """``(height, width)`` from the header of ``image`` (a file's path, or the encoded bytes themselves, as a parquet
    row holds them) as the image looks (after its EXIF orientation, as the records' ``image/height`` and
    ``image/width`` and DALI's ``peek_image_shape``); None for what is no readable image or is larger than
    ``max_pixels`` (the shard writer names it, or skips it with ``--skip-bad``)."""
    Image.MAX_IMAGE_PIXELS = max_pixels  # PIL's decompression-bomb guard, as prepare_image sets it
    try:
        if isinstance(image, bytes):
            height, width = displayed_header(image)[:2]
        else:
            with open_regular(image) as f:
                height, width = displayed_header(f)[:2]
    except (OSError, SyntaxError, ValueError, IndexError, Image.DecompressionBombError):
        return None
    if width < 1 or height < 1 or width * height > max_pixels:
        return None
    return height, width


UNREADABLE = Fraction(2**64)  # past any aspect ratio an image can have: images without a readable size sort last


def aspect_key(size: tuple[int, int] | None) -> Fraction:
    """The sort key of an image of ``size`` (`header_size`'s): its width / height, exact; `UNREADABLE` for None."""
    return Fraction(size[1], size[0]) if size else UNREADABLE


def aspect_sorted(items: list[Item], max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> list[Item]:
    """``items`` by width / height (exact fractions), ties in their given order; images whose header cannot be
    read last."""
    keys = [aspect_key(header_size(it.path, max_pixels)) for it in items]
    return [items[i] for i in sorted(range(len(items)), key=keys.__getitem__)]
