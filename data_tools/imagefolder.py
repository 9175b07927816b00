"""Find the images of an ImageFolder-style tree and their classes; prepare each for a record.

Layout: ``ROOT/train/<class>/*`` and either ``ROOT/val/<class>/*`` or a flat ``ROOT/val/*`` with a
labels file (Kaggle's ``LOC_val_solution.csv`` or ``filename class`` lines). Without ``train/``, ``ROOT/val/<class>/*``
or ``ROOT/<class>/*`` is a set to evaluate on: a validation split alone (`_validation_only`). Class names sort to
labels as text (``1, 10, 2``: torchvision's ImageFolder order; timm's reader sorts naturally, docs/DATA.md); the ImageNet synsets get their WordNet lemmas (shipped with timm) as ``image/class/text``.
A class folder's images may sit in subfolders at any depth (``train/<class>/batch2/x.jpg``, as
torchvision's ImageFolder takes them): each is labelled by the class folder that holds it. Links are
followed, each image once: a link that makes an image reachable twice (under another class, or twice in
its own) is refused naming it (`_refuse_twice`), as is a name with a control character (`check_name`).
`layout_warnings` names classes with few training images and classes that validation lacks.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import re
import stat
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, NamedTuple

from PIL import Image, ImageOps

from vitlarge.data.manifest_schema import CONTROL_RE, MAX_SYNSET
from vitlarge.errors import UserError
from vitlarge.fileio import UnsafeFile, is_inside, open_regular, read_capped

DEFAULT_MAX_IMAGE_PIXELS = 89_478_485  # PIL's own default (~9459 x 9459); ImageNet's largest is ~32M pixels
# A file larger than this many bytes a pixel of the pixel limit holds no image within it (8-bit RGBA unpacked is 4):
# refused from its size, before a byte is read (a sparse 4 GiB "JPEG" took 4 GiB of memory to be skipped).
MAX_BYTES_PER_PIXEL = 4
MAX_PIXELS_FIX = "raise --max-image-pixels if you trust it"
JPEG_QUALITY = 95  # for the few images we must re-encode (PNG, CMYK, grayscale)


@dataclass(frozen=True)
class Item:
    """One source image and what its record will say about it."""

    path: str
    label: int  # stored label: class index + label offset
    synset: str
    text: str
    size: int  # bytes on disk, for the resume digest and progress


class BadImage(Exception):
    """A source file that is not a readable image; ``args[0]`` is its path, ``args[1]`` why."""


def check_name(folder: str, name: str, what: str = "name") -> str:
    """``name`` (of an entry of ``folder``), or a UserError, with the name shown escaped (``repr``), where it holds
    a control character: the converter prints names (a skipped image, an unreadable one, a class of few images),
    and a newline in one would print a line of its own (``error: ...``) that the log's reader takes for ours."""
    found = CONTROL_RE.search(name)
    if found:
        raise UserError(
            f"{folder}: the {what} {name!r} holds the control character {found.group()!r}, which would forge or hide "
            "lines of this log; rename it"
        )
    return name


def _files(d: str) -> list[str]:
    return sorted(
        os.path.join(d, check_name(d, n))
        for n in os.listdir(d)
        if not n.startswith(".") and os.path.isfile(os.path.join(d, n))
    )


@dataclass(frozen=True)
class _Found:
    """A file under a class folder, and where it resolves when a link leads to it (else None: it is where it is)."""

    path: str
    resolved: str | None


def _files_below(d: str) -> list[_Found]:
    """Every file under ``d`` at any depth, sorted by path (hidden names skipped, as in `_files`). Links to
    folders are followed, each folder walked once; a link to ``d`` or a folder above it (a loop, which would
    take in the other classes) is refused. A file reached through a link (its own or a folder's) carries where
    it resolves, for `_refuse_twice`; one lstat a file, one realpath a folder."""
    out, seen, inside = [], set(), os.path.realpath(d)
    lexical = os.path.join(os.path.realpath(os.path.dirname(d)), os.path.basename(d))  # d itself may be a link

    def unreadable(e: OSError) -> None:
        raise UserError(f"{e.filename}: cannot list it ({e.strerror}); make it readable or remove it")

    for folder, subfolders, names in os.walk(d, onerror=unreadable, followlinks=True):
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            subfolders[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        subfolders[:] = sorted(check_name(folder, n, "folder") for n in subfolders if not n.startswith("."))
        for n in subfolders:
            target = os.path.realpath(os.path.join(folder, n))
            if inside == target or inside.startswith(target.rstrip(os.sep) + os.sep):
                raise UserError(
                    f"{os.path.join(folder, n)}: links to {target}, which holds the class folder {d} (a loop); "
                    "remove the link"
                )
        real = os.path.realpath(folder)
        linked = real != os.path.normpath(os.path.join(lexical, os.path.relpath(folder, d)))
        for n in names:
            if n.startswith("."):
                continue
            path = os.path.join(folder, check_name(folder, n, "file name"))
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:  # gone since the listing
                continue
            if stat.S_ISLNK(mode):
                if os.path.isfile(path):
                    out.append(_Found(path, os.path.realpath(path)))
            elif stat.S_ISREG(mode):
                out.append(_Found(path, os.path.join(real, n) if linked else None))
    return sorted(out, key=lambda f: f.path)


def _refuse_twice(split_dir: str, found: list[tuple[_Found, str]]) -> None:
    """A UserError naming the link where a link inside the tree makes one image reachable twice: under two classes
    (``train/a/extra -> ../b`` would store b's images as class a too: a mislabel), or twice in one class (weighed
    double). Links to folders outside the tree are followed as torchvision's ImageFolder follows them, each image
    once. Costs nothing where no file is reached through a link."""
    if all(f.resolved is None for f, _ in found):
        return
    real_split = os.path.realpath(split_dir)
    first: dict[str, tuple[_Found, str]] = {}
    for f, cls in found:
        key = f.resolved or os.path.join(real_split, os.path.relpath(f.path, split_dir))
        if key not in first:
            first[key] = (f, cls)
            continue
        other, other_cls = first[key]
        linked, was = (f, cls) if f.resolved is not None else (other, other_cls)
        elsewhere, where = (other, other_cls) if linked is f else (f, cls)
        twice = f"as class {was!r} and as class {where!r} (a mislabel)"
        if was == where:
            twice = f"twice in class {was!r}" if was else "twice"
        raise UserError(
            f"{_first_link(linked.path, split_dir)}: a link that makes {linked.path} the image {elsewhere.path}, "
            f"which would be stored {twice}; remove the link, or copy the image where it belongs"
        )


def _first_link(path: str, top: str) -> str:
    """The first link on the way from ``top`` down to ``path`` (``path`` itself where none is above it)."""
    here = top
    for part in os.path.relpath(path, top).split(os.sep):
        here = os.path.join(here, part)
        if os.path.islink(here):
            return here
    return path


def _class_dirs(split_dir: str) -> list[str]:
    """The class folders of a split, sorted; a name with a control character, or longer than a manifest's synset
    (`MAX_SYNSET`), is a UserError naming it."""
    names = sorted(
        n for n in os.listdir(split_dir) if not n.startswith(".") and os.path.isdir(os.path.join(split_dir, n))
    )
    for n in names:
        check_name(split_dir, n, "class folder")
        if len(n) > MAX_SYNSET:
            raise UserError(
                f"{split_dir}: the class folder {n[:40]!r}... has a name of {len(n):,} characters, more than the "
                f"{MAX_SYNSET:,} a class name may have (dataset.json's synset); rename it"
            )
    return names


def class_texts(synsets: list[str]) -> dict[str, str]:
    """WordNet lemmas for ImageNet synsets from timm's bundled table; other names map to ""."""
    spec = importlib.util.find_spec("timm")  # locate the table without importing torch
    texts: dict[str, str] = {}
    if spec and spec.origin:
        table = os.path.join(os.path.dirname(spec.origin), "data", "_info", "imagenet_synset_to_lemma.txt")
        if os.path.exists(table):
            wanted = set(synsets)
            with open(table) as f:
                for line in f:
                    key, _, text = line.rstrip("\n").partition("\t")
                    if key in wanted:
                        texts[key] = text
    return {s: texts.get(s, "") for s in synsets}


def discover(src: str, val_labels: str | None, label_offset: int) -> tuple[list[str], dict[str, list[Item]]]:
    """Return (sorted class names, {"train": items, "validation": items}); UserError on bad layout."""
    if not os.path.isdir(src):
        raise UserError(f"{src}: source directory does not exist; pass --src ROOT with ROOT/train/<class>/*")
    train_dir = os.path.join(src, "train")
    if not os.path.isdir(train_dir):
        found = _validation_only(src, label_offset)
        if found is None:
            raise UserError(
                f"{train_dir}: missing; the source needs ROOT/train/<class>/* (ImageFolder layout), or for a set to "
                "evaluate on, ROOT/val/<class>/* or ROOT/<class>/*"
            )
        return found
    classes = _class_dirs(train_dir)
    if not classes:
        raise UserError(f"{train_dir}: no class directories; expected ROOT/train/<class>/<image>")
    texts = class_texts(classes)
    label_of = {c: i + label_offset for i, c in enumerate(classes)}

    def item(path: str, cls: str) -> Item:
        return Item(path, label_of[cls], cls, texts[cls], os.path.getsize(path))

    splits = {"train": [item(f.path, c) for f, c in _class_files(train_dir, classes)]}

    val_dir = os.path.join(src, "val")
    if os.path.isdir(val_dir):
        val_classes = _class_dirs(val_dir)
        flat = _files(val_dir)
        if val_classes and not flat:
            found = []
            for c in val_classes:
                d = os.path.join(val_dir, c)
                if c not in label_of:
                    raise UserError(
                        f"{d}: class '{c}' is not in {train_dir}; validation classes must be a subset "
                        "of the training classes (rename or remove it)"
                    )
                files = _files_below(d)
                if not files:
                    raise UserError(f"{d}: empty class directory; add images or remove it")
                found += [(f, c) for f in files]
            _refuse_twice(val_dir, found)
            splits["validation"] = [item(f.path, c) for f, c in found]
        elif flat:
            if not val_labels:
                raise UserError(
                    f"{val_dir}: flat validation directory needs labels; pass --val-labels "
                    "LOC_val_solution.csv (Kaggle) or a file of 'filename class' lines"
                )
            labels = read_val_labels(val_labels)
            found = [(_Found(p, os.path.realpath(p) if os.path.islink(p) else None), "") for p in flat]
            _refuse_twice(val_dir, found)
            splits["validation"] = []
            for p in flat:
                name = os.path.basename(p)
                cls = labels.get(name, labels.get(os.path.splitext(name)[0]))
                if cls is None:
                    raise UserError(f"{p}: no label in {val_labels}; add a line for it or remove the image")
                if cls not in label_of:
                    raise UserError(
                        f"{val_labels}: class {cls[:60]!r} (for {name}) is not in {train_dir}; "
                        "fix the labels file or add the class to train"
                    )
                splits["validation"].append(item(p, cls))
    return classes, splits


def _class_files(split_dir: str, classes: list[str]) -> list[tuple[_Found, str]]:
    """Every file of each class folder of ``split_dir`` with its class, each image once (`_refuse_twice`); an empty
    class folder is a UserError naming it."""
    found: list[tuple[_Found, str]] = []
    for c in classes:
        files = _files_below(os.path.join(split_dir, c))
        if not files:
            raise UserError(f"{os.path.join(split_dir, c)}: empty class directory; add images or remove it")
        found += [(f, c) for f in files]
    _refuse_twice(split_dir, found)
    return found


def evaluation_folder(src: str) -> str:
    """Where a source without ``train/`` holds its classes: ``ROOT/val`` where there is one, else ``ROOT`` itself (a
    flat folder of class folders, as a test set is often handed over)."""
    val_dir = os.path.join(src, "val")
    return val_dir if os.path.isdir(val_dir) else src


def check_out(src: str, out: str) -> None:
    """A UserError (one line, before anything is read or removed) where ``out`` is inside a folder whose subfolders
    are read as classes (``ROOT/train``, ``ROOT/val``, or a flat ``ROOT`` itself: `evaluation_folder`): a rerun
    would read the converted folder as a class and remove its dataset.json. ``ROOT/tfrecords`` beside ``train/``
    is fine."""
    train_dir = os.path.join(src, "train")
    folders = [train_dir, os.path.join(src, "val")] if os.path.isdir(train_dir) else [evaluation_folder(src)]
    for folder in folders:
        if os.path.isdir(folder) and is_inside(out, folder):
            raise UserError(
                f"{out}: --out is inside {os.path.normpath(folder)}, whose folders are read as classes; choose an "
                "--out outside it"
            )


def _validation_only(src: str, label_offset: int) -> tuple[list[str], dict[str, list[Item]]] | None:
    """`discover`'s answer for a source converted for evaluation alone: its class folders (`evaluation_folder`) as
    the validation split, labelled by their names sorted as text as `discover` labels a training split's; None
    where it has no class folder. Training on the result is refused naming the missing split
    (`vitlarge.data.manifest.Manifest.shards`); ``vitlarge.evaluate`` matches its classes to a model's by name."""
    folder = evaluation_folder(src)
    classes = _class_dirs(folder)
    if not classes:
        return None
    texts = class_texts(classes)
    found = _class_files(folder, classes)
    label_of = {c: i + label_offset for i, c in enumerate(classes)}
    items = [Item(f.path, label_of[c], c, texts[c], os.path.getsize(f.path)) for f, c in found]
    return classes, {"validation": items}


MIN_CLASS_IMAGES = 10
"""Fewer training images than this in a class is warned about (a download that stopped, a misplaced folder)."""


def layout_warnings(
    src: str, classes: list[str], splits: dict[str, list[Item]], min_images: int = MIN_CLASS_IMAGES
) -> list[str]:
    """One line each, without the ``warning:`` prefix: the classes with fewer than ``min_images`` training
    images, and the classes the validation split has no image of (their accuracy would go unmeasured).
    Either may be intended (a few-shot set, a partial val); the conversion goes on."""

    def some(names: list[str], what=lambda c: c) -> str:
        shown = ", ".join(what(c) for c in names[:5])
        return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")

    lines = []
    counts = {c: 0 for c in classes}
    for it in splits.get("train", ()):
        counts[it.synset] += 1
    few = [c for c in classes if counts[c] < min_images] if "train" in splits else []
    if few:
        lines.append(
            f"{len(few)} of {len(classes)} classes {'has' if len(few) == 1 else 'have'} fewer than {min_images} "
            f"training images ({some(few, lambda c: f'{c}: {counts[c]}')}) in {os.path.join(src, 'train')}; "
            "add images or remove the class (--min-class-images N sets this threshold)"
        )
    root = os.path.realpath(src)
    linked = [it.path for items in splits.values() for it in items if not is_inside(it.path, root)]
    if linked:  # followed as torchvision's ImageFolder follows them; said, since a downloaded tree may carry links
        lines.append(
            f"{len(linked):,} {'image is' if len(linked) == 1 else 'images are'} read through links to outside {src} "
            f"({linked[0]} -> {os.path.realpath(linked[0])}{', ...' if len(linked) > 1 else ''}); they are converted "
            "as their class's images: remove the links if that is not intended"
        )
    if "validation" in splits:
        in_val = {it.synset for it in splits["validation"]}
        absent = [c for c in classes if c not in in_val]
        if absent:
            lines.append(
                f"{len(absent)} of {len(classes)} classes {'has' if len(absent) == 1 else 'have'} no validation "
                f"image ({some(absent)}): validation does not measure {'it' if len(absent) == 1 else 'them'}; "
                f"add images to {os.path.join(src, 'val')} if that is not intended"
            )
    return lines


VAL_LABELS_MAX_BYTES = 64 << 20
"""The most bytes of a ``--val-labels`` file read: Kaggle's LOC_val_solution.csv (50,000 rows) is ~2.4 MB."""


def read_val_labels(path: str) -> dict[str, str]:
    """{filename or stem: class} from Kaggle's LOC_val_solution.csv or ``filename class`` lines. The file is data:
    read up to `VAL_LABELS_MAX_BYTES`; an image labelled twice with two classes, a row without its class and bytes
    that are not UTF-8 are each one `UserError` naming the file (and line)."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: validation labels file not found; pass an existing --val-labels")
    try:
        text = read_capped(path, VAL_LABELS_MAX_BYTES).decode("utf-8-sig")
    except UnsafeFile as e:
        raise UserError(
            f"--val-labels {path} {e.strerror}; pass Kaggle's LOC_val_solution.csv or a file of 'filename class' lines"
        ) from None
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}: not UTF-8 text (byte {e.start:,}); pass Kaggle's LOC_val_solution.csv or a file "
            "of 'filename class' lines"
        ) from None
    out: dict[str, str] = {}
    where: dict[str, int] = {}

    def label(n: int, name: str, cls: str) -> None:
        if out.get(name, cls) != cls:
            raise UserError(
                f"{path}:{n}: {name[:80]} is labelled {cls[:60]} here and {out[name][:60]} on line {where[name]}; "
                "keep one line per image"
            )
        out[name], where[name] = cls, where.get(name, n)

    f = io.StringIO(text, newline="")
    if text.startswith("ImageId,PredictionString"):
        rows = csv.reader(f)
        next(rows)
        for row in rows:
            if not row:
                continue
            if len(row) != 2:
                raise UserError(
                    f"{path}:{rows.line_num}: expected 'ImageId,PredictionString' (an image and its class first), got "
                    f"{','.join(row)[:80]!r}; fix the row or use Kaggle's LOC_val_solution.csv as it is"
                )
            tokens = row[1].split()
            if tokens:
                label(rows.line_num, row[0], tokens[0])
    else:
        for n, line in enumerate(f, 1):
            parts = line.replace(",", " ").split()
            if not parts:
                continue
            if len(parts) != 2:
                raise UserError(
                    f"{path}:{n}: expected 'filename class', got {line.strip()[:80]!r}; "
                    "fix the line or use Kaggle's LOC_val_solution.csv"
                )
            label(n, parts[0], parts[1])
    if not out:
        raise UserError(f"{path}: no labels found; expected 'filename class' lines or LOC_val_solution.csv")
    return out


# Frame headers we pass through untouched: baseline, extended and progressive Huffman JPEG.
# Anything else (lossless, arithmetic coding, 12-bit) goes through PIL like a non-JPEG file.
_SOF_FAST = {0xC0, 0xC1, 0xC2}


def jpeg_frame(data: bytes) -> tuple[int, int, int] | None:
    """(height, width, components) from a JPEG's frame header, or None if not a plain 8-bit JPEG.

    Walks the marker segments up to the frame header (tens of microseconds; PIL's parser takes
    ~10x longer and dominated the conversion time).
    """
    if data[:2] != b"\xff\xd8":
        return None
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        length = (data[i + 2] << 8) | data[i + 3]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if marker not in _SOF_FAST or i + 10 > n or data[i + 4] != 8:
                return None
            return (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8], data[i + 9]
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame header
            return None
        i += 2 + length
    return None


EXIF_ORIENTATION = 0x0112  # the EXIF tag
TURNED = {5, 6, 7, 8}  # EXIF orientations that turn the image a quarter: its displayed height is its stored width


def jpeg_orientation(data: bytes) -> int:
    """The EXIF orientation (1-8) of a JPEG's first Exif segment, 1 where it has none or it cannot be read: the
    tag DALI's decoders and PIL's ``exif_transpose`` apply. A marker walk as `jpeg_frame`'s, reading the few bytes
    of IFD0's entries, bounded by the segment."""
    i, n = 2, len(data)
    while i + 4 <= n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0xD9, 0xDA):
            return 1
        length = (data[i + 2] << 8) | data[i + 3]
        if marker == 0xE1 and data[i + 4 : i + 10] == b"Exif\0\0":
            return _ifd0_orientation(data[i + 10 : i + 2 + length])
        i += 2 + length
    return 1


def _ifd0_orientation(tiff: bytes) -> int:
    order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1

    def num(at: int, size: int) -> int:
        return int.from_bytes(tiff[at : at + size], order)  # type: ignore[arg-type]

    ifd = num(4, 4)
    if ifd + 2 > len(tiff):
        return 1
    for k in range(num(ifd, 2)):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(tiff):
            return 1
        if num(entry, 2) == EXIF_ORIENTATION:
            value = num(entry + 8, 2)
            return value if 1 <= value <= 8 else 1
    return 1


TRANSPARENT_MODES = ("RGBA", "LA", "PA", "RGBa", "La")  # PIL modes with an alpha channel
HEAD_BYTES = 1 << 16  # of a file read for its JPEG frame header: its Exif segment (at most 64 KiB) comes before


class Header(NamedTuple):
    """What an encoded image's header says of it as it looks, nothing decoded."""

    height: int  # after its EXIF orientation: DALI's ``peek_image_shape``, the records' ``image/height``
    width: int
    transparent: bool  # has an alpha channel or a transparent colour: `upright_rgb` composites it, DALI drops it
    format: str  # PIL's name: "JPEG", "PNG", "WEBP", ...


def displayed_header(source: bytes | IO[bytes]) -> Header:
    """The `Header` of an encoded image (its bytes, or a seekable file at its start), the one rule for "its size
    as it looks" wherever an image is read in place or sorted (the converter's `val_order`, parquet's spill,
    make_index on TFDS, ``--image-key`` and WebDataset sets): a plain JPEG from its frame header and its first
    Exif segment (`jpeg_frame`, `jpeg_orientation`, what DALI applies), anything else from PIL's header parse and
    its EXIF orientation tag. Raises what PIL raises (OSError, SyntaxError, ValueError, IndexError,
    ``Image.DecompressionBombError`` at ``Image.MAX_IMAGE_PIXELS``) where it is no image PIL knows."""
    head = source if isinstance(source, bytes) else source.read(HEAD_BYTES)
    frame = jpeg_frame(head)
    if frame is not None and frame[0] > 0 and frame[1] > 0:
        return Header(*_as_it_looks(frame[0], frame[1], jpeg_orientation(head)), False, "JPEG")
    if not isinstance(source, bytes):
        source.seek(0)
    with warnings.catch_warnings():  # PIL warns past Image.MAX_IMAGE_PIXELS: the callers' own guard says it in one line
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        opened = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
    with opened as im:
        # PIL's TIFF plugin reports a TIFF's size already turned by its orientation tag (and turns it on load)
        orientation = None if im.format == "TIFF" else im.getexif().get(EXIF_ORIENTATION)
        height, width = _as_it_looks(im.height, im.width, orientation)
        transparent = im.mode in TRANSPARENT_MODES or "transparency" in im.info
        return Header(height, width, transparent, im.format or "")


def _as_it_looks(height: int, width: int, orientation: int | None) -> tuple[int, int]:
    """``(height, width)`` of an image stored at ``height`` x ``width`` with EXIF ``orientation``, as it looks:
    the sides swapped for the orientations that turn it a quarter (`TURNED`)."""
    return (width, height) if orientation in TURNED else (height, width)


IMAGE_ENDS = {"JPEG": b"\xff\xd9", "PNG": b"IEND\xaeB`\x82"}  # the bytes a whole file of these formats ends with
"""A JPEG's end-of-image marker and a PNG's IEND chunk: a file that lacks them was cut short (a download that stopped)
or carries bytes after its end; `check_whole` decodes it to tell which."""


def check_whole(header: Header, tail: bytes, read: Callable[[], bytes]) -> None:
    """Raise ValueError where an image read in place (`make_index`) is truncated or damaged, as the converter's
    ``--check header`` finds it: a JPEG or PNG whose last bytes (``tail``) are not its format's end (`IMAGE_ENDS`) is
    decoded (its bytes from ``read()``), and a decode PIL cannot finish is refused; one with bytes after its end
    decodes and passes, as it does in DALI. DALI would stop a run on a truncated image in training."""
    end = IMAGE_ENDS.get(header.format)
    if end is None or tail.endswith(end):
        return
    try:
        with _open(read()) as im:
            im.load()
    except (OSError, SyntaxError, ValueError, IndexError) as e:
        why = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(e)).strip() or type(e).__name__
        raise ValueError(f"a truncated or damaged image ({why[:80]})") from None


class Prepared(NamedTuple):
    """What a record stores of one source image: RGB JPEG bytes whose decode (EXIF orientation applied, as DALI's
    decoders and PIL's ``exif_transpose`` apply it) is the image as it looks, and its height and width as it looks
    (after that rotation: DALI's ``peek_image_shape``, which rectangular validation's crops follow)."""

    data: bytes
    height: int
    width: int
    reencoded: bool  # decoded and written again as RGB JPEG (PNG, grayscale, CMYK, ...)
    transparent: bool  # had transparency, composited on `BACKGROUND`


BACKGROUND = (255, 255, 255)
"""What a transparent image is composited on before training: white, as a browser or an image viewer shows a
transparent PNG and as PIL's ``convert("RGB")`` users who paste on white expect (dropping the alpha instead turns a
drawing held in its alpha into a blank picture)."""


WIDE_GREY_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # PIL's modes of a 16-bit grey PNG or TIFF
_TO_8_BIT = [(v * 255 + 32767) // 65535 for v in range(65536)]  # round(v * 255 / 65535), as DALI decodes 16 bits


def _eight_bit(im: Image.Image) -> Image.Image:
    """A 16-bit grey image at 8 bits as DALI reads the same file in place (``round(v * 255 / 65535)``), its
    transparent grey (``info["transparency"]``, a 16-bit value) kept as an alpha channel ("LA"). PIL's own
    ``convert("L")``/``convert("RGB")`` clips every value past 255 instead: a 16-bit photo reads white."""
    wide = im if im.mode == "I" else im.convert("I")
    out = wide.point(_TO_8_BIT, "L")
    key = im.info.get("transparency")
    if isinstance(key, int):
        out.putalpha(wide.point([0 if v == key else 255 for v in range(65536)], "L"))
    return out


def upright_rgb(im: Image.Image) -> tuple[Image.Image, bool]:
    """``(im as it looks, in RGB; whether it had transparency)``: its EXIF orientation applied (once: the result
    carries no orientation tag), a 16-bit grey image scaled to 8 bits (`_eight_bit`), a transparent image (RGBA,
    LA, PA, or a palette or RGB/L image with a transparent colour) composited on `BACKGROUND`. The one rule for images the converter decodes, and the rule
    the docs' timm snippet writes out in PIL for images read outside vitlarge."""
    im = ImageOps.exif_transpose(im) or im
    if im.mode in WIDE_GREY_MODES:
        im = _eight_bit(im)
    transparent = im.mode in TRANSPARENT_MODES or "transparency" in im.info
    if transparent:
        rgba = im.convert("RGBA")
        im = Image.alpha_composite(Image.new("RGBA", rgba.size, (*BACKGROUND, 255)), rgba)
    return im.convert("RGB"), transparent


def prepare_image(path: str, check: str = "header", max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> Prepared:
    """`prepare_bytes` of the file at ``path``, or BadImage naming it.

    Source images are data: an image of more than ``max_pixels`` pixels is a BadImage naming the
    limit, judged from its header before anything is decoded (PIL's decompression-bomb guard, kept
    on at this limit; a 40000 x 40000 PNG header would otherwise allocate 4.8 GB); a file of more than
    `MAX_BYTES_PER_PIXEL` bytes a pixel of that limit is one from its size, before it is read. Only regular files
    are opened (a FIFO in the tree never blocks the converter).
    """
    cap = MAX_BYTES_PER_PIXEL * max_pixels
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(cap + 1) if size <= cap else b""  # a file that grows meanwhile is read to the cap, no more
        if max(size, len(data)) > cap:
            raise _TooLarge(_too_many_bytes(max(size, len(data)), max_pixels))
    except _TooLarge as e:
        raise BadImage(path, str(e)) from None
    except OSError as e:
        raise BadImage(path, str(e)) from None
    return prepare_bytes(data, path, check, max_pixels)


def prepare_bytes(
    data: bytes, name: str, check: str = "header", max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
) -> Prepared:
    """The record's image for the encoded image ``data`` (``name``: what a BadImage names), or BadImage.

    Three-component 8-bit JPEGs keep their original bytes, EXIF orientation tag included (DALI's decoders apply
    it: ``adjust_orientation``, on by default). Anything else PIL can read (PNG, CMYK or grayscale JPEG, whatever
    the file extension says) is decoded, made upright and opaque by `upright_rgb`, and re-encoded as RGB JPEG: the
    re-encoded file has no tag, so the rotation is applied here, once. ``check="header"`` parses the headers and
    requires the JPEG end marker, decoding only files without it (truncated files fail the decode; files with
    trailing bytes pass); ``check="decode"`` decodes every image.
    """
    Image.MAX_IMAGE_PIXELS = max_pixels  # PIL reads its guard from this global; one value per process
    try:
        if len(data) > MAX_BYTES_PER_PIXEL * max_pixels:
            raise _TooLarge(_too_many_bytes(len(data), max_pixels))
        frame = jpeg_frame(data)
        if frame is not None and frame[2] == 3 and frame[0] > 0 and frame[1] > 0:
            _check_pixels(frame[1], frame[0], max_pixels)
            if check == "decode" or not data.endswith(IMAGE_ENDS["JPEG"]):
                _open(data).load()
            height, width = _as_it_looks(frame[0], frame[1], jpeg_orientation(data))
            return Prepared(data, height, width, False, False)
        im = _open(data)
        _check_pixels(*im.size, max_pixels)
        im.load()
        if im.format == "JPEG" and im.mode == "RGB":  # e.g. arithmetic-coded: PIL reads it as is
            height, width = _as_it_looks(im.height, im.width, im.getexif().get(EXIF_ORIENTATION))
            return Prepared(data, height, width, False, False)
        im, transparent = upright_rgb(im)
        out = io.BytesIO()
        im.save(out, "JPEG", quality=JPEG_QUALITY)
        return Prepared(out.getvalue(), im.height, im.width, True, transparent)
    except _TooLarge as e:
        raise BadImage(name, str(e)) from None
    except Image.DecompressionBombError as e:  # PIL's own guard, at twice the limit, while parsing the header
        found = re.search(r"\((\d+) pixels\)", str(e))
        pixels = f"{int(found.group(1)):,} pixels" if found else str(e)
        raise BadImage(name, _too_large(pixels, max_pixels)) from None
    except (OSError, SyntaxError, ValueError, IndexError) as e:
        # PIL names the in-memory buffer ("cannot identify image file <_io.BytesIO object at 0x...>"): the path says more
        why = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(e)).strip()
        raise BadImage(name, why or type(e).__name__) from None


def _too_many_bytes(size: int, max_pixels: int) -> str:
    return (
        f"{size:,} bytes, more than {MAX_BYTES_PER_PIXEL} a pixel of --max-image-pixels "
        f"{max_pixels:,} (a memory guard; {MAX_PIXELS_FIX})"
    )


class _TooLarge(Exception):
    pass


def _too_large(pixels: str, max_pixels: int) -> str:
    return f"{pixels}, more than --max-image-pixels {max_pixels:,} (a decompression-bomb guard; {MAX_PIXELS_FIX})"


def too_many_pixels(width: int, height: int, max_pixels: int) -> str | None:
    """Why an image of ``width`` x ``height`` is refused (the decompression-bomb guard, ``--max-image-pixels``), or
    None: the one rule for the converter and for images indexed in place (`data_tools.make_index`)."""
    if width * height > max_pixels:
        return _too_large(f"{width} x {height} = {width * height:,} pixels", max_pixels)
    return None


def too_many_bytes(size: int, max_pixels: int) -> str | None:
    """Why an encoded image of ``size`` bytes is refused before a byte of it is read (more than `MAX_BYTES_PER_PIXEL`
    a pixel of ``max_pixels``: a memory guard), or None: the converter's rule, and make_index's for images in place."""
    return _too_many_bytes(size, max_pixels) if size > MAX_BYTES_PER_PIXEL * max_pixels else None


def bomb_refusal(e: Image.DecompressionBombError, max_pixels: int) -> str:
    """`too_many_pixels`' line for an image whose header PIL's own guard refused (past twice ``Image.MAX_IMAGE_PIXELS``,
    before its size is known to the caller): its pixels as PIL's message gives them."""
    pixels = re.search(r"\((\d+) pixels\)", str(e))
    return _too_large(f"{int(pixels[1]):,} pixels" if pixels else "an image past PIL's own pixel guard", max_pixels)


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    why = too_many_pixels(width, height, max_pixels)
    if why:
        raise _TooLarge(why)


def _open(data: bytes) -> Image.Image:
    """``Image.open``, which parses the header only; PIL's guard raises there at twice
    ``Image.MAX_IMAGE_PIXELS`` and only warns above it, so `_check_pixels` follows before any ``load``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data))
