"""Write DALI indexes and ``dataset.json`` for TFRecord shards made elsewhere (e.g. TensorFlow).

    python -m data_tools.make_index /data/imagenet-tf      # shards train-* and validation-*
    python -m data_tools.make_index /data/imagenet-1k-wds  # WebDataset tars in timm's layout (`wds_index`)

Reads every record once (checking framing and CRCs, so a truncated shard is reported by name),
writes ``<shard>.idx`` next to each shard and a manifest inferred from what it saw: splits from
the file names, record counts, label offset 1 (the TF ImageNet convention, ``--label-offset`` to
change) and ``num_classes`` from the largest label seen (``--num-classes`` to state it, e.g. a
split that lacks the last class). Each split must be one complete ``-of-N`` set: a directory
that mixes sets or lacks a shard is refused, naming the files, before anything is written.
Class synsets and texts come from the records when present (a synset or text longer than the manifest holds
is one warning line, and the manifest lists no class names), and the validation images' sizes from
their ``image/height`` and ``image/width`` (TensorFlow's ImageNet records have them; written beside each
shard as ``<shard>.sizes``, so that the manifest stays the size of its classes and shards); a validation split
whose sizes are in aspect-ratio order is marked so (``"order": "aspect"``, what ``data.rect_val`` needs:
the converter's output is, TensorFlow's is not); and the converter's count of skipped
unreadable images (``--skip-bad``) from its done-records (or the ``dataset.json`` it replaces, for the same
shards) when the shards are the converter's.
Rerun it whenever a loader reports a missing or stale index.

    python -m data_tools.make_index /mnt/ro/imagenet-tf --out ~/index/imagenet   # writes nothing into /mnt/ro

``--out``: a data folder it may not (or should not) write, e.g. a read-only shared mount. The indexes, sizes
files and ``dataset.json`` go into the index folder, whose manifest names the data folder once (``data_dir``);
``train.py --data <index folder>`` then reads the shards where they are.

TFDS's layout, read in place (`data_tools.tfds_layout`)::

    python -m data_tools.make_index ~/tensorflow_datasets/imagenet2012/5.1.0 --out ~/index/imagenet2012

A folder holding ``dataset_info.json`` beside ``<name>-<split>.tfrecord-NNNNN-of-NNNNN`` shards is a TFDS
version folder: the splits (train, validation) and each shard's record count come from dataset_info.json
(checked against the records read; a shard it lists that is missing, or a count that disagrees, is refused),
the image and label features from its supervised keys (``image``, ``label``), the number of classes and their
names from features.json and ``label.labels.txt``, the label offset is 0, and every image's size comes from
its own header (PIL reads the header, never decodes: the validation split's ``.sizes`` for rectangular
validation; a payload that is no image is refused). ``--image-key`` and ``--label-key`` do the same for any
TFRecord set whose records name their features otherwise (pass ``--label-offset 0`` where its labels start at 0).

Shards are files from elsewhere: each must be a regular file of the directory (a link only to a
file inside it; a FIFO or device is refused, never opened), every record a ``tf.train.Example`` with
an integer label in range, and the converter's output must hold one conversion's shards (a
re-conversion that stopped part-way leaves two under one set of names: refused, naming both).
Any of these is one line naming the file, exit status 2, and no ``dataset.json`` written.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import multiprocessing as mp
import os
import sys
from dataclasses import dataclass

from PIL import Image

from vitlarge import command
from vitlarge.data.manifest import (
    ASPECT_ORDER,
    CONFINED_FIX,
    MANIFEST_NAME,
    SHARD_RE,
    ClassInfo,
    Manifest,
    ShardInfo,
    confined_size,
    load_manifest,
    make_index_fix,
    shard_parts,
    shard_set_problem,
    write_manifest,
)
from vitlarge.data.manifest_schema import (
    MAX_CLASS_TEXT,
    MAX_CLASSES,
    MAX_LABEL,
    MAX_SIDE,
    MAX_SYNSET,
    TF_SLIM_FEATURES,
    has_control_character,
    out_of_aspect_order,
)
from vitlarge.errors import UserError, cli_main
from vitlarge.text import plural

from . import done_records, tfds_layout, tfrecord_io, wds_index
from .imagefolder import (
    DEFAULT_MAX_IMAGE_PIXELS,
    Header,
    bomb_refusal,
    check_whole,
    displayed_header,
    too_many_bytes,
    too_many_pixels,
)

TOOL = "data_tools.make_index"
TOOL_VERSION = "1.0.0"


@dataclass(frozen=True)
class RecordReader:
    """What `index_shard` takes of each record (a picklable parse for `tfrecord_io.scan_records`): ``(label or None,
    synset, text, (height, width) or None)``. ``features``: the image and label feature names. ``headers``: the
    image's size from its own header (PIL reads the header only, no decode), and a payload that is no image
    refused (ValueError, which the scan names by shard and byte), a transparent one too (a UserError naming
    ``shard`` and the record's ``file_name``); for shards made without ``image/height`` and ``image/width`` (TFDS's,
    ``--image-key``'s)."""

    features: tuple[str, str] = TF_SLIM_FEATURES
    headers: bool = False
    shard: str = ""  # the shard being read (`index_shard` sets it), for messages
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # an image past it is refused, as the converter refuses it

    def __call__(self, payload: bytes) -> tuple[int | None, str, str, tuple[int, int] | None]:
        return _label_info(payload, self.features, self.headers, self.shard, self.max_pixels)


def _header_size(image: bytes, key: str, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> Header:
    """The image's `Header` (its size as it looks: `imagefolder.displayed_header`); ValueError where ``image`` is
    not an image PIL knows; `tfrecord_io.RecordRefused` where it is one DALI does not decode
    (`wds_index.IN_PLACE_FORMATS`, as a WebDataset's), one past ``max_pixels`` pixels or its bytes
    (`imagefolder.too_many_pixels`, `too_many_bytes`: the converter's guards), or a truncated one
    (`imagefolder.check_whole`, the converter's header check)."""
    too_large = too_many_bytes(len(image), max_pixels)
    if too_large:
        raise tfrecord_io.RecordRefused(f"feature {key!r} holds an image of {too_large}")
    try:
        header = displayed_header(image)
    except Image.DecompressionBombError as e:  # past twice Image.MAX_IMAGE_PIXELS, which `index_shard` sets
        raise tfrecord_io.RecordRefused(f"feature {key!r} holds an image of {bomb_refusal(e, max_pixels)}") from None
    except Exception as e:  # noqa: BLE001 (PIL's UnidentifiedImageError, a short header)
        raise ValueError(f"feature {key!r} holds no image ({type(e).__name__}); re-convert this shard") from None
    if header.format not in wds_index.IN_PLACE_FORMATS:  # PIL reads it, DALI's decoder would stop on it in training
        raise tfrecord_io.RecordRefused(
            f"feature {key!r} holds a {header.format} image, which DALI does not decode in place (JPEG, PNG or WebP); "
            "re-write the record with the image as JPEG"
        )
    height, width = header[:2]
    if not (1 <= height <= MAX_SIDE and 1 <= width <= MAX_SIDE):
        raise ValueError(f"feature {key!r} holds an image of {width} x {height}, sides outside 1..{MAX_SIDE}")
    too_large = too_many_pixels(width, height, max_pixels)
    if too_large:
        raise tfrecord_io.RecordRefused(f"feature {key!r} holds an image of {too_large}")
    try:
        check_whole(header, image[-8:], lambda: image)
    except ValueError as e:
        raise tfrecord_io.RecordRefused(
            f"feature {key!r} holds {e}; re-write the record with its whole image"
        ) from None
    return header


def _label_info(
    payload: bytes,
    features: tuple[str, str] = TF_SLIM_FEATURES,
    headers: bool = False,
    shard: str = "",
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> tuple[int | None, str, str, tuple[int, int] | None]:
    ex = tfrecord_io._EXAMPLE()
    ex.ParseFromString(payload)
    feat = ex.features.feature
    image_key, label_key = features

    def text(key: str) -> str:
        values = feat[key].bytes_list.value if key in feat else []
        return values[0].decode("utf-8", "replace") if values else ""

    def side(key: str) -> int | None:
        values = feat[key].int64_list.value if key in feat else []
        return values[0] if values and 1 <= values[0] <= MAX_SIDE else None

    labels = feat[label_key].int64_list.value if label_key in feat else []
    if headers:
        images = feat[image_key].bytes_list.value if image_key in feat else []
        if not images:
            raise ValueError(f"no feature {image_key!r} (--image-key names the image's feature)")
        header = _header_size(images[0], image_key, max_pixels)
        if header.transparent:  # read in place, it would train otherwise than it looks
            name = text("file_name") or "a record"
            raise UserError(f"{shard}: {name}: feature {image_key!r} holds {wds_index.TRANSPARENT_IN_PLACE}")
        size = header.height, header.width
    else:
        height, width = side("image/height"), side("image/width")
        size = (height, width) if height and width else None
    return (labels[0] if labels else None), text("image/class/synset"), text("image/class/text"), size


def index_shard(job: tuple[str, str, RecordReader]) -> tuple[str, int, int, str, dict, tuple | None]:
    """Index one shard, ``(shard path, index path, reader)``; return (name, records, bytes, checksum, {label:
    (synset, text)}, the records' image sizes or None where a record has none)."""
    path, index_path, reader = job
    reader = dataclasses.replace(reader, shard=path)
    Image.MAX_IMAGE_PIXELS = reader.max_pixels  # PIL's guard at a header follows the option (a worker starts at PIL's)
    label_key = reader.features[1]
    try:
        n, size, checksum, labels = tfrecord_io.write_index_for(path, parse=reader, index_path=index_path)
    except OSError as e:  # the index folder turned unwritable (or full) after the check before reading
        raise UserError(f"{index_path}: cannot write ({e.strerror or e}); {_WRITE_FIX}") from None
    if n == 0:
        raise UserError(f"{path}: holds no records (DALI cannot read an empty shard); re-convert its set")
    seen: dict[int, tuple[str, str]] = {}
    sizes = tuple(s for *_, s in labels)
    for label, synset, text, _ in labels:
        if label is None:
            raise UserError(
                f"{path}: record without {label_key!r}; not an image classification shard (--label-key names the "
                "label's feature)"
            )
        if not -MAX_LABEL <= label <= MAX_LABEL:
            raise UserError(
                f"{path}: a record has label {label}, outside +-{MAX_LABEL}; not an image classification shard"
            )
        seen.setdefault(label, (synset, text))
    return os.path.basename(path), n, size, checksum, seen, (sizes if all(sizes) else None)


_WRITE_FIX = (
    "make it writable, or write the indexes and dataset.json elsewhere with --out <index folder> (nothing is "
    "written into the data folder then)"
)


def _index_folder(data_dir: str, out: str | None) -> tuple[str, str]:
    """``(index folder, manifest's data_dir)``: ``data_dir`` itself and "" without ``out`` (or where ``out`` is the
    same folder); else ``out``, made where missing, and ``data_dir`` as an absolute path. Nothing is written into
    ``data_dir`` then: a read-only mount is indexed as it is."""
    if out is None or (os.path.isdir(out) and os.path.samefile(out, data_dir)):
        return data_dir, ""
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out}: cannot make the index folder ({e.strerror}); pass a writable --out") from None
    return out, os.path.abspath(data_dir)


def _writable_index_folder(data_dir: str, out: str | None) -> tuple[str, str]:
    """`_index_folder`, checked writable (access(2) also says EROFS: a read-only mount, before any shard is read)."""
    index_dir, shard_dir = _index_folder(data_dir, out)
    if not os.access(index_dir, os.W_OK):
        raise UserError(f"{index_dir}: not writable; {_WRITE_FIX}")
    return index_dir, shard_dir


def make_index(
    data_dir: str,
    *,
    out: str | None = None,
    label_offset: int | None = None,
    num_classes: int | None = None,
    workers: int = 1,
    image_key: str | None = None,
    label_key: str | None = None,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> Manifest:
    """Index ``data_dir``'s shards and write its manifest (module docstring); with ``out``, the indexes, sizes and
    ``dataset.json`` go into ``out``, whose manifest names ``data_dir`` (``--data out`` reads the shards there).
    ``label_offset``: None is TFDS's 0 for a TFDS folder, TF ImageNet's 1 otherwise; ``image_key``/``label_key``:
    the records' feature names where not TF-slim's (TFDS's: from its dataset_info.json). ``max_image_pixels``: the
    converter's guard, for the images whose headers are read (TFDS, ``--image-key``, WebDataset)."""
    tfds = tfds_layout.read_info(data_dir, (image_key, label_key)) if tfds_layout.is_tfds(data_dir) else None
    if label_offset is None:
        label_offset = 0 if tfds else 1
    features = tfds.features if tfds else (image_key or TF_SLIM_FEATURES[0], label_key or TF_SLIM_FEATURES[1])
    if features[0] == features[1]:
        raise UserError(f"--image-key and --label-key are both {features[0]!r}; name the two features")
    if tfds and num_classes is None:
        num_classes = tfds.num_classes or (len(tfds.class_names) if tfds.class_names else None)
    if num_classes is not None and not 1 <= num_classes <= MAX_CLASSES:
        raise UserError(f"--num-classes {num_classes}: expected 1..{MAX_CLASSES}")
    if not -MAX_LABEL <= label_offset <= MAX_LABEL:
        raise UserError(f"--label-offset {label_offset}: expected {-MAX_LABEL}..{MAX_LABEL}")
    bad = next((p for p in (data_dir, out) if p and has_control_character(os.path.abspath(p))), None)
    if bad is not None:  # dataset.json's data_dir could not hold it
        raise UserError(
            f"{bad!r}: a folder path with a control character, which {MANIFEST_NAME} cannot record; rename it"
        )
    if not os.path.isdir(data_dir):
        raise UserError(f"{data_dir}: directory does not exist; pass the directory holding train-*/validation-* shards")
    names = sorted(n for n in os.listdir(data_dir) if (SHARD_RE.match(n) or tfds and shard_parts(n)))
    if tfds:
        _check_tfds_shards(data_dir, tfds, names)
    if not names and wds_index.is_webdataset(data_dir):
        m = wds_index.make_index(
            data_dir, lambda: _writable_index_folder(data_dir, out), num_classes, workers, max_image_pixels
        )
        return publish(
            m, sum(len(v) for v in m.splits.values()), ("sample", "tar"), (" (WebDataset, read in place)", "")
        )
    if not names:
        raise UserError(
            f"{data_dir}: no shards named train-NNNNN-of-NNNNN or validation-NNNNN-of-NNNNN (nor a TFDS folder: "
            "dataset_info.json beside <name>-train.tfrecord-NNNNN-of-NNNNN); rename the shards to that scheme "
            "(TensorFlow's ImageNet script uses it)"
        )
    problem = shard_set_problem(names)
    if problem:
        raise UserError(f"{data_dir}: {problem[0]}; {problem[1]}, then rerun {make_index_fix(data_dir)}")
    root = os.path.realpath(data_dir)
    sizes = {}
    for n in names:  # before any file is opened: a FIFO would block the reader, a link may lead anywhere
        try:
            sizes[n] = confined_size(os.path.join(data_dir, n), root)
        except OSError as e:
            raise UserError(f"{os.path.join(data_dir, n)}: {e.strerror}; {CONFINED_FIX}") from None
    _refuse_mixture(data_dir, {n: (sizes[n], None) for n in names}, unknown=False)
    index_dir, shard_dir = _writable_index_folder(data_dir, out)
    reader = RecordReader(features, headers=features != TF_SLIM_FEATURES, max_pixels=max_image_pixels)
    paths = [(os.path.join(data_dir, n), os.path.join(index_dir, n + ".idx"), reader) for n in names]
    if workers > 1 and len(paths) > 1:
        with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            results = list(pool.map(index_shard, paths))
    else:
        results = [index_shard(p) for p in paths]

    _refuse_mixture(data_dir, {name: (size, checksum) for name, _, size, checksum, _, _ in results})
    if tfds:
        tfds_layout.check_counts(data_dir, tfds, {name: n for name, n, *_ in results})
        if num_classes is not None:  # known before reading: a label outside it is named with its shard
            given = f"{tfds_layout.FEATURES_NAME} declares" if num_classes == tfds.num_classes else "--num-classes says"
            _check_labels(data_dir, results, label_offset, num_classes, given)
    seen: dict[int, tuple[str, str]] = {}
    splits: dict[str, list[ShardInfo]] = {}
    for name, n, size, checksum, labels, sizes in results:
        for k, v in labels.items():
            seen.setdefault(k, v)
        split = shard_parts(name)[1]  # pyright: ignore[reportOptionalSubscript] (names were matched above)
        sizes = sizes if split == "validation" else None  # what rectangular validation reads; train's would be MBs
        splits.setdefault(split, []).append(ShardInfo(name, name + ".idx", n, size, checksum, sizes))
    lo, hi = min(seen), max(seen)
    if lo < label_offset:
        raise UserError(
            f"{data_dir}: label {lo} is below --label-offset {label_offset}; pass --label-offset {lo} "
            "(0 for shards whose labels start at 0)"
        )
    inferred = hi - label_offset + 1
    if inferred > MAX_CLASSES:
        raise UserError(
            f"{data_dir}: label {hi} with offset {label_offset} means {inferred:,} classes, more than {MAX_CLASSES:,}; "
            "check the shards' labels and --label-offset"
        )
    if num_classes is None:
        num_classes = inferred
    elif num_classes < inferred:
        raise UserError(
            f"{data_dir}: label {hi} is outside --num-classes {num_classes} with offset {label_offset}; "
            f"pass --num-classes {inferred} or more"
        )
    if tfds and tfds.class_names:  # TFDS's names of every class, seen or not; the records carry none
        seen = {label_offset + i: (name, "") for i, name in enumerate(tfds.class_names)}
    classes = [ClassInfo(k, *seen[k]) for k in sorted(seen)] if all(s for s, _ in seen.values()) else []
    too_long = _too_long(seen)
    if classes and too_long:
        print(f"warning: {data_dir}: {too_long}", file=sys.stderr)
        classes = []
    m = Manifest(
        num_classes=num_classes,
        label_offset=label_offset,
        classes=classes,
        splits=splits,
        order=_order(splits.get("validation")),
        skipped=_skipped(data_dir, index_dir, splits),
        tool=TOOL,
        tool_version=TOOL_VERSION,
        data_dir=index_dir,
        shard_dir=shard_dir,
        features=features,
    )
    return publish(m, len(paths), ("record", "shard"), ("", f", label offset {label_offset}"))


def publish(m: Manifest, indexes: int, units: tuple[str, str], notes: tuple[str, str]) -> Manifest:
    """Writes ``m``'s sizes files and ``dataset.json`` into its ``data_dir`` (the index folder) and says so in one
    line (``units``: what a split counts, in what; ``notes``: said after the manifest's name and the classes);
    returns the manifest read back."""
    index_dir, path = m.data_dir, os.path.join(m.data_dir, MANIFEST_NAME)
    try:
        write_manifest(m, index_dir)
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror}); {_WRITE_FIX}") from None
    counts = ", ".join(
        f"{s}: {plural(m.num_examples(s), units[0], grouped=True)} in {plural(len(v), units[1])}"
        for s, v in m.splits.items()
    )
    print(
        f"wrote {plural(indexes, 'index', 'indexes')} and {path}{notes[0]}: {counts}; "
        f"{plural(m.num_classes, 'class')}{notes[1]}"
        + (f"; train with --data {index_dir} (it reads the {units[1]}s in {m.shard_dir})" if m.shard_dir else ""),
        file=sys.stderr,
    )
    return load_manifest(index_dir)


def _check_tfds_shards(data_dir: str, tfds: tfds_layout.TfdsInfo, names: list[str]) -> None:
    """The TFDS shards of ``names`` against dataset_info.json: every shard it lists is there (the first missing one
    named), and no train or validation shard it does not list."""
    for split in tfds.shard_lengths:
        for shard in tfds.shard_names(split):
            if shard not in names:
                raise UserError(
                    f"{os.path.join(data_dir, shard)}: missing ({tfds_layout.INFO_NAME} lists "
                    f"{len(tfds.shard_lengths[split]):,} {split} shards); restore it from the copy the folder came "
                    "from (a partial copy trains on part of the data)"
                )
    listed = {n for split in tfds.shard_lengths for n in tfds.shard_names(split)}
    extra = sorted(set(names) - listed)
    if extra:
        raise UserError(
            f"{os.path.join(data_dir, extra[0])}: a shard {tfds_layout.INFO_NAME} does not list (it lists "
            f"{', '.join(f'{len(v):,} {k}' for k, v in tfds.shard_lengths.items())} shards); remove it, or restore "
            f"the {tfds_layout.INFO_NAME} of its preparation"
        )


def _check_labels(data_dir: str, results: list, label_offset: int, num_classes: int, given: str) -> None:
    """Every shard's labels within ``num_classes`` from ``label_offset``: the first outside is named by its shard."""
    for name, *_, labels, _ in results:
        bad = next((k for k in sorted(labels) if not label_offset <= k < label_offset + num_classes), None)
        if bad is not None:
            raise UserError(
                f"{os.path.join(data_dir, name)}: a record has label {bad}, outside the {num_classes:,} classes "
                f"{given} ({label_offset}..{label_offset + num_classes - 1}); the shard "
                "is not of this data set: restore it from the copy the folder came from"
            )


def _too_long(seen: dict[int, tuple[str, str]]) -> str | None:
    """The first class whose synset or text is longer than the manifest holds (`MAX_SYNSET`, `MAX_CLASS_TEXT`),
    said with what the manifest then lists; None where every class fits. Such names are not a data set's class
    names (WordNet's are 9 characters): the manifest lists none rather than one its readers refuse."""
    for label in sorted(seen):
        for what, text, limit in zip(("synset", "text"), seen[label], (MAX_SYNSET, MAX_CLASS_TEXT)):
            if len(text) > limit:
                return (
                    f"label {label}'s image/class/{what} is {len(text):,} characters, more than the {limit:,} "
                    f"{MANIFEST_NAME} holds; it lists no class names (training needs none; an export names its "
                    "classes by index)"
                )
    return None


def _order(shards: list[ShardInfo] | None) -> dict[str, str]:
    """``{"validation": "aspect"}`` where every validation record has its size and they are in that order."""
    if not shards or any(s.sizes is None for s in shards):
        return {}
    return (
        {"validation": ASPECT_ORDER} if out_of_aspect_order([x for s in shards for x in s.sizes or ()]) is None else {}
    )


def _skipped(data_dir: str, index_dir: str, splits: dict[str, list[ShardInfo]]) -> dict[str, int]:
    """Per split, the images the converter skipped as unreadable: from the done-records of the shards (in
    ``data_dir``) when every shard of the split has one that matches it (size and checksum), else from the
    ``dataset.json`` this replaces (in ``index_dir``) when it lists the same shards; a split of shards made
    elsewhere counts none."""
    previous: dict[str, int] = {}
    try:
        old = load_manifest(index_dir)
        same = {
            s: old.skipped.get(s, 0)
            for s in splits
            if len(old.splits.get(s, [])) == len(splits[s]) and all(map(ShardInfo.same_shard, old.splits[s], splits[s]))
        }
        previous = {s: n for s, n in same.items() if n}
    except UserError:  # no manifest (the usual reason to run make_index), or one that does not parse
        pass

    def listed_skipped(shard: ShardInfo) -> list | None:
        rec = done_records.read_record(data_dir, shard.file)
        if rec and rec.get("bytes") == shard.bytes and rec.get("checksum") == shard.checksum:
            return rec.get("skipped") if isinstance(rec.get("skipped"), list) else None
        return None

    out = {}
    for split, shards in splits.items():
        lists = [listed_skipped(s) for s in shards]
        if all(x is not None for x in lists):
            out[split] = sum(len(x or []) for x in lists)
        elif split in previous:
            out[split] = previous[split]
    return {s: n for s, n in out.items() if n}


def _refuse_mixture(data_dir: str, shards: dict[str, tuple[int, str | None]], unknown: bool = True) -> None:
    problem = done_records.mixture_problem(data_dir, shards, unknown=unknown)
    if problem:
        raise UserError(
            f"{data_dir}: {problem}; a re-conversion stopped part-way: rerun the conversion you want (it keeps "
            "complete shards and redoes the rest), or convert into an empty --out; indexing the mixture would "
            "train on some images twice and never on others"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command("data_tools.make_index"), description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir")
    p.add_argument(
        "--out",
        metavar="INDEX_FOLDER",
        help="write the indexes and dataset.json here, nothing into data_dir (a read-only mount); "
        "then pass --data INDEX_FOLDER",
    )
    p.add_argument(
        "--label-offset", type=int, help="stored label of class 0 (default: TF ImageNet's 1; a TFDS folder's 0)"
    )
    p.add_argument("--image-key", help="the image's feature name (default: image/encoded; a TFDS folder's own)")
    p.add_argument("--label-key", help="the label's feature name (default: image/class/label; a TFDS folder's own)")
    p.add_argument("--num-classes", type=int, help="default: inferred from the largest label")
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="an image read in place with more pixels is refused, as the converter refuses it (a decompression-bomb "
        "guard); raise it for trusted, very large images",
    )
    a = p.parse_args(argv)
    if a.max_image_pixels < 1:
        p.error("--max-image-pixels must be >= 1")
    options = ("out", "label_offset", "num_classes", "workers", "image_key", "label_key", "max_image_pixels")
    return cli_main(lambda: make_index(a.data_dir, **{k: getattr(a, k) for k in options}))


if __name__ == "__main__":
    sys.exit(main())
