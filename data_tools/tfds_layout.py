"""TFDS's on-disk layout (tensorflow-datasets 4.x), read without TensorFlow: what `data_tools.make_index` needs
to index a TFDS version folder in place, and a writer of the same layout for tests and benchmarks.

A prepared TFDS data set is a version folder (``~/tensorflow_datasets/imagenet2012/5.1.0/``) holding::

    imagenet2012-train.tfrecord-00000-of-01024 ...         tf.train.Example records: image (encoded bytes),
    imagenet2012-validation.tfrecord-00000-of-00064 ...    label (int64, 0-based), file_name (bytes)
    dataset_info.json    the DatasetInfo proto as JSON: "name", "splits": [{"name", "shardLengths": ["1251", ...],
                         "numBytes"}], "supervisedKeys" ({"input", "output"}, or since 4.5 {"tuple": {"items":
                         [{"featureKey": "image"}, {"featureKey": "label"}]}})
    features.json        the FeaturesDict as JSON: the label's {"classLabel": {"numClasses": "1000"}}
    label.labels.txt     the label's class names, one a line (ClassLabel's names file)

(int64 fields are JSON strings: protobuf's JSON mapping.) `read_info` parses what make_index uses of it:
the split's shard lengths (each shard's record count, checked against the records read), the image and label
feature names, the number of classes and their names. Only ``train`` and ``validation`` are read (timm's
``tfds/`` reader calls ImageNet's validation split ``validation`` too); other splits (``test``) are left alone.

Every file here is data from elsewhere: read capped (`INFO_CAP`), parsed, and anything that is not what TFDS
writes is a `UserError` naming the file and the key.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from vitlarge.data.manifest_schema import MAX_CLASSES, MAX_RECORDS, SPLITS, TFDS_SHARD_RE
from vitlarge.errors import UserError
from vitlarge.fileio import UnsafeFile, read_capped, write_atomic

INFO_NAME = "dataset_info.json"
FEATURES_NAME = "features.json"
LABELS_SUFFIX = ".labels.txt"  # ClassLabel's names file: <label feature>.labels.txt
INFO_CAP = 16 << 20  # bytes of each metadata file: ImageNet-21K's 21,841 names are ~250 KB, its shard lengths ~10 KB
_FEATURE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,255}$")


@dataclass(frozen=True)
class TfdsInfo:
    """What a TFDS version folder says of itself (`read_info`)."""

    name: str  # the data set's name: its shards are <name>-<split>.tfrecord-NNNNN-of-NNNNN
    shard_lengths: dict[str, list[int]]  # split -> records per shard, in shard order (train/validation present)
    features: tuple[str, str]  # (image, label) feature names: supervisedKeys', else ("image", "label")
    num_classes: int | None  # features.json's classLabel.numClasses where given
    class_names: list[str] | None  # <label>.labels.txt where present

    def shard_names(self, split: str) -> list[str]:
        n = len(self.shard_lengths[split])
        return [f"{self.name}-{split}.tfrecord-{i:05d}-of-{n:05d}" for i in range(n)]


def is_tfds(data_dir: str) -> bool:
    """Whether ``data_dir`` is a TFDS version folder: a ``dataset_info.json`` beside TFDS-named shards."""
    try:
        names = os.listdir(data_dir)
    except OSError:
        return False
    return INFO_NAME in names and any(TFDS_SHARD_RE.match(n) for n in names)


def _load(path: str, what: str):
    try:
        return json.loads(read_capped(path, INFO_CAP))
    except UnsafeFile as e:
        raise UserError(f"{path}: {e.strerror}; {what}") from None
    except OSError as e:
        raise UserError(f"{path}: unreadable ({e.strerror or e}); {what}") from None
    except (ValueError, RecursionError) as e:
        raise UserError(f"{path}: not JSON ({str(e)[:80]}); {what}") from None


def _count(v, path: str, key: str, hi: int) -> int:
    """A proto int64 as JSON writes it (a string of digits; an int where hand-written)."""
    if isinstance(v, str) and v.isdigit() and len(v) <= 19:
        v = int(v)
    if type(v) is not int or not 0 <= v <= hi:
        raise UserError(f"{path}: {key} is {str(v)[:40]!r}, expected a count 0..{hi}; {_FIX}")
    return v


_FIX = "restore the file TFDS wrote (tfds.builder(name).download_and_prepare() writes it again)"


def read_info(data_dir: str, features: tuple[str | None, str | None] = (None, None)) -> TfdsInfo:
    """Parse ``data_dir``'s dataset_info.json, features.json (where present) and the label's names file (where
    present); ``features``: ``(image, label)`` feature names that override supervisedKeys'. UserError naming the
    file and key for anything TFDS does not write."""
    path = os.path.join(data_dir, INFO_NAME)
    doc = _load(path, _FIX)
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str) or not isinstance(doc.get("splits"), list):
        raise UserError(f"{path}: expected TFDS's DatasetInfo (an object with 'name' and 'splits'); {_FIX}")
    name = doc["name"]
    if not re.fullmatch(r"[a-z0-9_]{1,128}", name):
        raise UserError(f"{path}: name is {name[:40]!r}, expected a TFDS data set name ([a-z0-9_]); {_FIX}")
    lengths: dict[str, list[int]] = {}
    for i, split in enumerate(doc["splits"][:64]):
        if not isinstance(split, dict) or not isinstance(split.get("name"), str):
            raise UserError(f"{path}: splits[{i}] has no name; {_FIX}")
        if split["name"] not in SPLITS:
            continue
        shards = split.get("shardLengths")
        if not isinstance(shards, list) or not 1 <= len(shards) <= 99_999:
            raise UserError(f"{path}: splits[{i}] ({split['name']}) has no shardLengths; {_FIX}")
        lengths[split["name"]] = [
            _count(n, path, f"{split['name']} shardLengths[{j}]", MAX_RECORDS) for j, n in enumerate(shards)
        ]
    if not lengths:
        raise UserError(f"{path}: lists no train or validation split; index a TFDS folder of an image data set")
    image, label = _supervised_keys(doc.get("supervisedKeys"), path)
    image, label = features[0] or image, features[1] or label
    num_classes = _num_classes(data_dir, label)
    class_names = _class_names(data_dir, label, num_classes)
    return TfdsInfo(name, lengths, (image, label), num_classes, class_names)


def _supervised_keys(keys, path: str) -> tuple[str, str]:
    """(image, label) of supervisedKeys, both of TFDS's forms; ("image", "label") where it names none."""
    pair: list = []
    if isinstance(keys, dict) and "input" in keys:
        pair = [keys.get("input"), keys.get("output")]
    elif isinstance(keys, dict) and isinstance(keys.get("tuple"), dict):
        items = keys["tuple"].get("items")
        pair = [i.get("featureKey") if isinstance(i, dict) else None for i in items] if isinstance(items, list) else []
    if not pair:
        return "image", "label"
    if len(pair) != 2 or not all(isinstance(k, str) and _FEATURE_RE.match(k) for k in pair):
        raise UserError(
            f"{path}: supervisedKeys is not an (image, label) pair of feature names; pass --image-key and --label-key"
        )
    return pair[0], pair[1]


def _num_classes(data_dir: str, label: str) -> int | None:
    """features.json's ``classLabel.numClasses`` of the label feature, where the file is there and says it."""
    path = os.path.join(data_dir, FEATURES_NAME)
    if not os.path.lexists(path):
        return None
    doc = _load(path, _FIX)
    top = doc.get("featuresDict", doc) if isinstance(doc, dict) else None  # 4.x: {"featuresDict": {"features": ..}}
    feats = top.get("features") if isinstance(top, dict) else None
    feat = feats.get(label) if isinstance(feats, dict) else None
    cls = feat.get("classLabel") if isinstance(feat, dict) else None
    if cls is None:
        return None
    n = _count(
        cls.get("numClasses") if isinstance(cls, dict) else cls, path, f"{label}.classLabel.numClasses", MAX_CLASSES
    )
    if n < 1:
        raise UserError(f"{path}: {label}.classLabel.numClasses is 0; {_FIX}")
    return n


def _class_names(data_dir: str, label: str, num_classes: int | None) -> list[str] | None:
    path = os.path.join(data_dir, label.replace("/", "-") + LABELS_SUFFIX)
    if not os.path.lexists(path):
        return None
    try:
        text = read_capped(path, INFO_CAP).decode("utf-8")
    except UnsafeFile as e:
        raise UserError(f"{path}: {e.strerror}; {_FIX}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: unreadable ({getattr(e, 'strerror', None) or e}); {_FIX}") from None
    names = [n.strip() for n in text.split("\n") if n.strip()]  # as TFDS's ClassLabel reads its names file
    if num_classes is not None and len(names) != num_classes:
        raise UserError(f"{path}: {len(names):,} class names, but {FEATURES_NAME} says {num_classes:,} classes; {_FIX}")
    return names


def check_counts(data_dir: str, info: TfdsInfo, counts: dict[str, int]) -> None:
    """Each shard's records as read (``counts``: shard name -> records) against dataset_info.json's shardLengths;
    the first disagreement is a UserError naming both."""
    for split, lengths in info.shard_lengths.items():
        for shard, expected in zip(info.shard_names(split), lengths):
            got = counts.get(shard)
            if got is not None and got != expected:
                raise UserError(
                    f"{os.path.join(data_dir, shard)}: {got:,} records, but {INFO_NAME} lists {expected:,} (its "
                    f"{split} shardLengths); the shard or {INFO_NAME} is from another preparation: {_FIX}"
                )


# --- writing the layout (tests and benchmarks: TFDS's files without TensorFlow) -------------------------------


def write_tfds(
    out: str,
    name: str,
    splits: dict[str, list[list[tuple[bytes, int, str]]]],
    class_names: list[str],
    *,
    version: str = "1.0.0",
) -> None:
    """Write ``out`` as tensorflow-datasets 4.x writes a prepared version folder: ``splits`` maps a split to its
    shards, each a list of ``(encoded image, 0-based label, file name)``, written as ``tf.train.Example`` records
    (features ``image``, ``label``, ``file_name``) by the ``tfrecord`` package's own writer; then
    dataset_info.json, features.json and label.labels.txt."""
    from tfrecord.writer import TFRecordWriter  # lazy: keeps the writer off make_index's path

    os.makedirs(out, exist_ok=True)
    info_splits = []
    for split, shards in splits.items():
        total = 0
        for i, records in enumerate(shards):
            path = os.path.join(out, f"{name}-{split}.tfrecord-{i:05d}-of-{len(shards):05d}")
            w = TFRecordWriter(path)
            for image, label, file_name in records:
                w.write({"image": (image, "byte"), "label": (label, "int"), "file_name": (file_name.encode(), "byte")})
            w.close()
            total += os.path.getsize(path)
        info_splits.append(
            {
                "name": split,
                "numBytes": str(total),
                "shardLengths": [str(len(s)) for s in shards],
                "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
            }
        )
    info = {
        "citation": "",
        "description": f"{name}, written in TFDS's layout",
        "fileFormat": "tfrecord",
        "moduleName": f"tensorflow_datasets.image_classification.{name}",
        "name": name,
        "releaseNotes": {version: "Initial release."},
        "splits": info_splits,
        "supervisedKeys": {"tuple": {"items": [{"featureKey": "image"}, {"featureKey": "label"}]}},
        "version": version,
    }
    features = {
        "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
        "featuresDict": {
            "features": {
                "image": {
                    "pythonClassName": "tensorflow_datasets.core.features.image_feature.Image",
                    "image": {"shape": {"dimensions": ["-1", "-1", "3"]}, "dtype": "uint8", "encodingFormat": "jpeg"},
                },
                "label": {
                    "pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
                    "classLabel": {"numClasses": str(len(class_names))},
                },
                "file_name": {"pythonClassName": "tensorflow_datasets.core.features.text_feature.Text", "text": {}},
            }
        },
    }
    write_atomic(os.path.join(out, INFO_NAME), json.dumps(info, indent=2))
    write_atomic(os.path.join(out, FEATURES_NAME), json.dumps(features, indent=2))
    write_atomic(os.path.join(out, "label" + LABELS_SUFFIX), "".join(n + "\n" for n in class_names))


def tfds_from_tfrecords(data_dir: str, out: str, name: str) -> None:
    """The converter's shards of ``data_dir`` (TF-slim features) rewritten in TFDS's layout into ``out``, the same
    image bytes in the same shards and order, labels 0-based: TFDS's copy of the same images, for comparing the
    two in place. Class names: the manifest's synsets (or the class indexes)."""
    from vitlarge.data.manifest import load_manifest, shard_files  # lazy: numpy off is_tfds's callers

    from .tfrecord_io import _EXAMPLE, scan_records  # lazy: as above

    m = load_manifest(data_dir)
    names = {c.label - m.label_offset: c.synset for c in m.classes}
    image_key, label_key = m.features
    splits: dict[str, list[list[tuple[bytes, int, str]]]] = {}
    for split in m.splits:
        shards = []
        for path, _ in shard_files(m, split):
            records = []
            for _, _, payload in scan_records(path):
                f = _EXAMPLE.FromString(payload).features.feature
                file_name = f["image/filename"].bytes_list.value[0].decode() if "image/filename" in f else ""
                records.append(
                    (f[image_key].bytes_list.value[0], f[label_key].int64_list.value[0] - m.label_offset, file_name)
                )
            shards.append(records)
        splits[split] = shards
    write_tfds(out, name, splits, [names.get(i, str(i)) for i in range(m.num_classes)])
