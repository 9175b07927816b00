"""The schema of ``dataset.json``: every value's type and range, checked before anything uses it.

A manifest comes from elsewhere (a converter nobody here wrote, a copied data folder), so it is
data, parsed and bounded: `parse` takes the file's bytes (already read with a size cap) and returns
the document with every field checked, or raises `ManifestProblem` whose text says which field is
wrong and why, in one line (``splits.train.shards[3].num_records is 'abc', expected an integer
1..1099511627776``). Names it lists are bare file names: a shard can only be a file of the data
folder itself (see `vitlarge.data.manifest.shard_files` for links).

A split may say how its records are ordered (``"order": "aspect"``: by width / height, what
rectangular validation needs, `vitlarge.data.rect`) and each of its shards where its images' sizes are:
``"sizes": "<shard>.sizes"``, a file of the data folder holding one ``(height, width)`` pair of little-endian
uint32 per record (`SIZES_SUFFIX`, read by `vitlarge.data.manifest.split_sizes`), or, as manifests written
before that file existed have them, ``"sizes": [[height, width], ...]`` inline. An order of ``aspect`` needs
every shard's sizes, in that order across the split (checked here for inline sizes, where they are read for
a file's).

A manifest may also say where its shards are and how their records name the image and the label (version 3):
``"data_dir": "/datasets/imagenet2012/5.1.0"`` (an absolute path, normalized: no ``..``), the one folder holding
every shard it lists, when ``dataset.json``, the DALI indexes and the sizes files sit in another folder (an index
folder, ``make_index <folder> --out <index folder>``, for a data folder that is read-only); ``"features": {"image":
"image", "label": "label"}``, the feature names of each ``tf.train.Example`` where they are not TF-slim's
(``image/encoded``, ``image/class/label``, `TF_SLIM_FEATURES`). Shard names are TF-slim's
(``train-00000-of-01024``) or TFDS's (``imagenet2012-train.tfrecord-00000-of-01024``, `TFDS_SHARD_RE`).

Versions (``format_version``, `VERSIONS`): 1, sizes inline or none; 2, a shard's sizes in its ``.sizes`` file,
which a reader of version 1 does not know; 3, ``data_dir``, ``features`` and TFDS's shard names, which a reader of
version 2 does not know. The writer writes the lowest version its content needs, so a folder without them stays
readable by older checkouts; a version newer than `VERSIONS` is `NewerManifest`, whose
fix is a newer vitlarge (rewriting the manifest with this one would undo the newer writer's work).

Limits: ``MANIFEST_CAP`` bytes, shard names of five digits (``-of-99999`` at most), ``MAX_CLASSES``
classes, ``MAX_RECORDS`` records per shard, sides of ``MAX_SIDE`` pixels, synsets of `MAX_SYNSET` and class
texts of `MAX_CLASS_TEXT` characters. The cap fits ImageNet-21K with room to spare: its 21,841 classes take
~100 bytes each (label, synset, WordNet lemmas) and a shard ~150 bytes, so 21,841 classes in 10,000 shards
are ~3.7 MB, and the images' sizes (8 bytes a record, 12 MB for 1.5M validation images) are in their own
files, never in the JSON: what the manifest holds grows with classes and shards, not with images.
"""

from __future__ import annotations

import json
import posixpath
import re

FORMAT = "vitlarge.tfrecord"
WDS_FORMAT = "vitlarge.webdataset"  # WebDataset tars read in place (timm's layout), `vitlarge.data.wds_shards`
FORMATS = (FORMAT, WDS_FORMAT)
TAR_INDEX_VERSION = "v1.2"  # DALI's wds2idx index of a tar: "<ext> <offset> <size> <name>" per member of a sample
TAR_INDEX_LINE_MAX = 4096  # bytes of a sample's index line: a few members, each a name of at most 255 bytes
TAR_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")  # timm's wds reader takes "jpg;png;webp"; DALI decodes each
TAR_LABEL_EXT = "cls"
FORMAT_VERSION = 3  # the newest this writes (where data_dir, features or TFDS names need it); it reads `VERSIONS`
VERSIONS = (1, 2, 3)  # 1: sizes inline or none; 2: a shard's sizes may be a file (<shard>.sizes); 3: data_dir, features
TF_SLIM_FEATURES = ("image/encoded", "image/class/label")  # (image, label): the converter's, TensorFlow's ImageNet's
MAX_FEATURE_NAME = 256  # characters of a feature name (TF-slim's are 17; TFDS's a few)
MAX_PATH = 4096  # characters of data_dir (Linux's PATH_MAX)
SPLITS = ("train", "validation")
MANIFEST_CAP = 16 << 20  # bytes: ~4x ImageNet-21K's (3.7 MB), ~50x ImageNet-1k's (300 KB); see the module's docstring
MAX_SYNSET = 1024  # characters of a class's synset (a folder name is at most 255 bytes; WordNet's ids are 9)
MAX_CLASS_TEXT = 4096  # characters of a class's text (WordNet's longest lemma list is ~300)
SIZES_SUFFIX = ".sizes"  # a shard's image sizes: <shard>.sizes, 8 bytes (two little-endian uint32) a record
MAX_CLASSES = 10_000_000
MAX_RECORDS = 1 << 40  # per shard; a record is at least 16 bytes, so also bounded by the shard's size
MAX_BYTES = 1 << 50  # per shard
MAX_LABEL = 1 << 31  # |label_offset| and |stored label|: TFRecord int64 labels in any practical data set
MAX_SIDE = 1 << 20  # pixels; JPEG's limit is 65,535
ASPECT_ORDER = "aspect"  # a split's "order": by width / height, non-decreasing
ORDERS = ("stored", ASPECT_ORDER)  # "stored": as written, nothing promised (a split without "order")
SHARD_NAME_RE = re.compile(r"^(train|validation)-(\d{5})-of-(\d{5})$")
TFDS_SHARD_RE = re.compile(r"^([a-z0-9_]{1,128})-(train|validation)\.tfrecord-(\d{5})-of-(\d{5})$")
_FEATURE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$")
CHECKSUM_RE = re.compile(r"^crc32c:[0-9a-f]{8}$")
_BARE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")  # no separator, no "..", no leading dot


class ManifestProblem(ValueError):
    """What is wrong with a manifest document, in one line (without the file's name)."""


class NewerManifest(ManifestProblem):
    """A manifest of a format version this vitlarge does not know, newer than its own: the fix is a newer vitlarge,
    never rewriting the manifest (its writer and this reader would then rewrite each other's folder)."""


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _int(doc: dict, key: str, where: str, lo: int, hi: int, default: int | None = None) -> int:
    if key not in doc:
        if default is None:
            raise ManifestProblem(f"{where}{key} is missing")
        return default
    v = doc[key]
    if type(v) is not int or not lo <= v <= hi:  # bool is an int subclass: refused too
        raise ManifestProblem(f"{where}{key} is {_show(v)}, expected an integer {lo}..{hi}")
    return v


def _str(doc: dict, key: str, where: str, default: str | None = None, max_len: int = 4096) -> str:
    if key not in doc:
        if default is None:
            raise ManifestProblem(f"{where}{key} is missing")
        return default
    v = doc[key]
    if not isinstance(v, str) or len(v) > max_len:
        raise ManifestProblem(f"{where}{key} is {_show(v)}, expected a string of at most {max_len} characters")
    return v


def _dict(v, where: str, allowed: set[str]) -> dict:
    if not isinstance(v, dict):
        raise ManifestProblem(f"{where or 'the document'} is {_show(v)}, expected an object")
    unknown = sorted(set(v) - allowed)
    if unknown:
        raise ManifestProblem(f"{where}{'.' if where else ''}{unknown[0]} is not a manifest key")
    return v


def _list(v, where: str, lo: int, hi: int) -> list:
    if not isinstance(v, list) or not lo <= len(v) <= hi:
        raise ManifestProblem(f"{where} is {_show(v)}, expected a list of {lo}..{hi} entries")
    return v


def _bare(name: str, where: str) -> str:
    if not _BARE_NAME_RE.match(name) or ".." in name:
        raise ManifestProblem(
            f"{where} is {_show(name)}, expected a file name inside the data folder (no '/', no '..', not hidden)"
        )
    return name


def _sizes(v, where: str, num_records: int, file: str, index: str) -> list[tuple[int, int]] | str:
    """The name of the shard's sizes file, or ``[[height, width], ...]`` inline: one pair of positive integers
    per record."""
    if isinstance(v, str):
        if v != file + SIZES_SUFFIX:  # the one name the writer gives it: no other file of the folder is read as sizes
            raise ManifestProblem(f"{where} is {_show(v)}, expected {file}{SIZES_SUFFIX}")
        return v
    pairs = _list(v, where, num_records, num_records)
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(x) is int and 1 <= x <= MAX_SIDE for x in pair)):
            raise ManifestProblem(f"{where}[{i}] is {_show(pair)}, expected [height, width] in pixels 1..{MAX_SIDE}")
    return [(h, w) for h, w in pairs]


def shard_parts(name: str) -> tuple[str, str, int, int] | None:
    """``(set, split, index, count)`` of a shard file name, TF-slim's (``train-00003-of-01024``: set ``train``) or
    TFDS's (``imagenet2012-train.tfrecord-00003-of-01024``: set ``imagenet2012-train.tfrecord``); None for any
    other name. Shards of one split form one set: one name before the index, one count."""
    m = SHARD_NAME_RE.match(name)
    if m:
        return m.group(1), m.group(1), int(m.group(2)), int(m.group(3))
    m = TFDS_SHARD_RE.match(name)
    if m:
        return f"{m.group(1)}-{m.group(2)}.tfrecord", m.group(2), int(m.group(3)), int(m.group(4))
    return None


def _shard(s, where: str, split: str, version: int) -> dict:
    s = _dict(s, where, {"file", "index", "num_records", "bytes", "checksum", "sizes"})
    where += "."
    file = _bare(_str(s, "file", where, max_len=255), where + "file")
    parts = shard_parts(file)
    if not parts or parts[1] != split or (version < 3 and not SHARD_NAME_RE.match(file)):
        raise ManifestProblem(
            f"{where}file is {_show(file)}, expected a {split} shard name like {split}-00000-of-00001"
        )
    index = _bare(_str(s, "index", where, max_len=255), where + "index")
    if index == file:
        raise ManifestProblem(f"{where}index is the shard itself ({file}), expected its DALI index, e.g. {file}.idx")
    n = _int(s, "num_records", where, 1, MAX_RECORDS)
    size = _int(s, "bytes", where, 16 * n, MAX_BYTES)
    checksum = s.get("checksum")
    if checksum is not None and not (isinstance(checksum, str) and CHECKSUM_RE.match(checksum)):
        raise ManifestProblem(f"{where}checksum is {_show(checksum)}, expected null or 'crc32c:' and 8 hex digits")
    out = {"file": file, "index": index, "num_records": n, "bytes": size, "checksum": checksum}
    if "sizes" in s:
        out["sizes"] = _sizes(s["sizes"], where + "sizes", n, file, index)
    return out


TAR_NAME_RE = re.compile(r"^.+\.tar$")


def _tar_shard(s, where: str, split: str, version: int) -> dict:
    """A WebDataset shard: any bare ``*.tar`` name (the names are its writer's, e.g. timm's
    ``imagenet1k-train-0000.tar``), its DALI index, and the fields a TFRecord shard has."""
    s = dict(_dict(s, where, {"file", "index", "num_records", "bytes", "checksum", "sizes"}))
    file = _bare(_str(s, "file", where + ".", max_len=255), where + ".file")
    if not TAR_NAME_RE.match(file):
        raise ManifestProblem(f"{where}.file is {_show(file)}, expected a tar file's name (<name>.tar)")
    sizes = s.pop("sizes", None)
    s["file"] = f"{split}-00000-of-00001"  # its other fields checked as a TFRecord shard's, under a stand-in name
    out = _shard(s, where, split, version)
    if out["index"] == file:
        raise ManifestProblem(f"{where}.index is the shard itself ({file}), expected its DALI index")
    out["file"] = file
    if sizes is not None:
        out["sizes"] = _sizes(sizes, where + ".sizes", out["num_records"], file, out["index"])
    return out


def parse(data: bytes) -> dict:
    """The checked document of a manifest's bytes: ``format`` matches and ``format_version`` is one of `VERSIONS`
    (`NewerManifest` for a later one), ``num_classes``,
    ``label_offset``, ``classes`` (label, synset, text), ``splits`` (train/validation, each with 1..99999
    shards of bare, distinct names; each split's ``order`` and its shards' ``sizes`` where given, in ``order``).
    `ManifestProblem` for anything else, including JSON errors and nesting too deep for the parser."""
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ManifestProblem("nested too deeply to be a manifest") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise ManifestProblem(f"not JSON ({e})") from None
    version = doc.get("format_version") if isinstance(doc, dict) else None
    if isinstance(doc, dict) and doc.get("format") in FORMATS and type(version) is int and version > VERSIONS[-1]:
        # before the keys are checked: a later version may add some
        raise NewerManifest(
            f"format version {version}, newer than this vitlarge reads ({', '.join(map(str, VERSIONS))})"
        )
    doc = _dict(
        doc,
        "",
        {"format", "format_version", "tool", "tool_version", "num_classes", "label_offset", "classes", "splits"}
        | ({"data_dir", "features"} if version == 3 else set()),
    )
    if doc.get("format") not in FORMATS or version not in VERSIONS or type(version) is not int:
        raise ManifestProblem(
            f"format {_show(doc.get('format'))} version {_show(version)}, "
            f"expected {' or '.join(map(repr, FORMATS))} version {' or '.join(map(str, VERSIONS))}"
        )
    out = {
        "format": doc["format"],
        "tool": _str(doc, "tool", "", default=""),
        "tool_version": _str(doc, "tool_version", "", default=""),
        "num_classes": _int(doc, "num_classes", "", 1, MAX_CLASSES),
        "label_offset": _int(doc, "label_offset", "", -MAX_LABEL, MAX_LABEL),
        "data_dir": _data_dir(doc["data_dir"]) if "data_dir" in doc else "",
        "features": _features(doc["features"]) if "features" in doc else TF_SLIM_FEATURES,
    }
    classes = []
    for i, c in enumerate(_list(doc.get("classes", []), "classes", 0, MAX_CLASSES)):
        where = f"classes[{i}]"
        c = _dict(c, where, {"label", "synset", "text"})
        classes.append(
            {
                "label": _int(c, "label", where + ".", -MAX_LABEL, MAX_LABEL),
                "synset": _str(c, "synset", where + ".", max_len=MAX_SYNSET),
                "text": _str(c, "text", where + ".", default="", max_len=MAX_CLASS_TEXT),
            }
        )
    out["classes"] = classes
    splits_doc = _dict(doc.get("splits"), "splits", set(SPLITS))
    if not splits_doc:
        raise ManifestProblem("splits is empty, expected 'train' and/or 'validation'")
    splits, skipped, orders = {}, {}, {}
    for split, body in splits_doc.items():
        where = f"splits.{split}"
        body = _dict(body, where, {"num_examples", "skipped", "order", "shards"})
        if "shards" not in body:
            raise ManifestProblem(f"{where}.shards is missing")
        shards = [
            (_tar_shard if out["format"] == WDS_FORMAT else _shard)(s, f"{where}.shards[{i}]", split, version)
            for i, s in enumerate(_list(body["shards"], where + ".shards", 1, 99_999))
        ]
        seen: set[str] = set()
        for s in shards:
            if s["file"] in seen:
                raise ManifestProblem(f"{where}.shards lists {s['file']} twice")
            seen.add(s["file"])
        _int(body, "num_examples", where + ".", 0, MAX_RECORDS * 99_999, default=0)  # derived; never used
        skipped[split] = _int(body, "skipped", where + ".", 0, MAX_RECORDS * 99_999, default=0)
        splits[split] = shards
        if "order" in body:
            orders[split] = _order(body["order"], where, shards)
    out["splits"], out["skipped"], out["order"] = splits, skipped, orders
    return out


def distinct_names(names) -> bool:
    """Whether ``names`` is a list of distinct class names of 1 to `MAX_SYNSET` characters each: what a checkpoint's
    meta.json and an export's ``label_names`` may hold (each adds its own bounds on the count)."""
    return (
        isinstance(names, list)
        and all(isinstance(n, str) and 0 < len(n) <= MAX_SYNSET for n in names)
        and len(set(names)) == len(names)
    )


CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
"""Characters that would make a printed name or path forge or hide a line of a log: C0 and C1 controls (a newline,
a carriage return, a terminal's escape), Unicode's line and paragraph separators and its bidirectional controls."""


def has_control_character(path: str) -> bool:
    """Whether ``path`` holds a `CONTROL_RE` character (a newline would split the fix commands messages print)."""
    return CONTROL_RE.search(path) is not None


def _data_dir(v) -> str:
    """``data_dir``: an absolute, normalized path (no ``..``, no ``.``, no doubled ``/``, no control characters), the
    folder of the shards."""
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_PATH or "\0" in v or not v.startswith("/"):
        raise ManifestProblem(f"data_dir is {_show(v)}, expected an absolute path of at most {MAX_PATH} characters")
    if has_control_character(v):
        raise ManifestProblem(f"data_dir is {_show(v)}, a path with a control character; index the folder again")
    if posixpath.normpath(v) != v or v.startswith("//"):
        raise ManifestProblem(f"data_dir is {_show(v)}, expected a normalized path (no '..', '.' or '//')")
    return v


def _features(v) -> tuple[str, str]:
    """``features``: ``{"image": name, "label": name}``, two distinct feature names."""
    v = _dict(v, "features", {"image", "label"})
    names = tuple(_str(v, k, "features.", max_len=MAX_FEATURE_NAME) for k in ("image", "label"))
    for k, name in zip(("image", "label"), names):
        if not _FEATURE_RE.match(name):
            raise ManifestProblem(f"features.{k} is {_show(name)}, expected a feature name ([A-Za-z0-9_./-])")
    if names[0] == names[1]:
        raise ManifestProblem(f"features.image and features.label are both {names[0]!r}, expected two features")
    return names[0], names[1]


def out_of_aspect_order(sizes: list[tuple[int, int]]) -> int | None:
    """The first of ``sizes`` (``(height, width)``) narrower than the one before it (width / height, compared
    exactly, as integers); None where they are in `ASPECT_ORDER`."""
    return next(
        (i for i in range(1, len(sizes)) if sizes[i][1] * sizes[i - 1][0] < sizes[i - 1][1] * sizes[i][0]), None
    )


def _order(order, where: str, shards: list[dict]) -> str:
    """A split's ``order``, checked against its shards' sizes."""
    if order not in ORDERS:
        raise ManifestProblem(f"{where}.order is {_show(order)}, expected one of {', '.join(map(repr, ORDERS))}")
    if order == ASPECT_ORDER:
        missing = next((i for i, s in enumerate(shards) if "sizes" not in s), None)
        if missing is not None:
            raise ManifestProblem(f"{where}.shards[{missing}].sizes is missing, which order {ASPECT_ORDER!r} needs")
        if any(isinstance(s["sizes"], str) for s in shards):
            return order  # in their files: checked where they are read (`vitlarge.data.manifest.split_sizes`)
        sizes = [size for s in shards for size in s["sizes"]]
        bad = out_of_aspect_order(sizes)
        if bad is not None:
            raise ManifestProblem(
                f"{where}: record {bad} ({sizes[bad][1]} x {sizes[bad][0]}) is narrower than the one before it "
                f"({sizes[bad - 1][1]} x {sizes[bad - 1][0]}), but the split's order is {ASPECT_ORDER!r} (by width / height)"
            )
    return order
