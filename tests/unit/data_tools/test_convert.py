"""data_tools: conversion round trip, index format, make_index, demo data, in this process. The tools as processes
(worker processes, kill -9, Ctrl-C, make_index's pool): tests/e2e/test_convert_processes.py."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import time

import pytest
from PIL import Image
from tfrecord.reader import tfrecord_loader
from tfrecord.tools.tfrecord2idx import create_index

from data_tools import imagefolder, imagenet_to_tfrecord, make_bench_dataset, make_index
from tests.helpers import ROOT, call_main
from tests.helpers.data_fixtures import SYNSETS, TINY_TRAIN_PER_CLASS, TINY_VAL_PER_CLASS, copy_imagefolder
from vitlarge.data.manifest import load_manifest, split_sizes
from vitlarge.errors import UserError

DESCRIPTION = {
    "image/encoded": "byte",
    "image/class/label": "int",
    "image/class/synset": "byte",
    "image/class/text": "byte",
    "image/height": "int",
    "image/width": "int",
    "image/channels": "int",
    "image/colorspace": "byte",
    "image/format": "byte",
    "image/filename": "byte",
}


def read_split(out: str, split: str) -> list[dict]:
    """All records of a split, read back with the ``tfrecord`` package's own reader."""
    m = load_manifest(out)
    return [rec for s in m.shards(split) for rec in tfrecord_loader(os.path.join(out, s.file), None, DESCRIPTION)]


def files_by_name(root: str) -> dict[str, str]:
    return {n: os.path.join(d, n) for d, _, names in os.walk(root) for n in names}


@pytest.fixture(scope="module")
def converted(tiny_imagefolder, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("converted"))
    imagenet_to_tfrecord.convert(tiny_imagefolder, out, train_shards=3, val_shards=2, workers=0, progress=False)
    return out


def test_round_trip_bytes_labels_and_schema(tiny_imagefolder, converted):
    sources = files_by_name(tiny_imagefolder)
    m = load_manifest(converted)
    assert (m.num_classes, m.label_offset) == (3, 1)
    assert [c.synset for c in m.classes] == list(SYNSETS)
    assert m.classes[0].text.startswith("tench")
    assert m.num_examples("train") == 3 * TINY_TRAIN_PER_CLASS
    assert m.num_examples("validation") == 3 * TINY_VAL_PER_CLASS
    reencoded = 0
    for split in ("train", "validation"):
        records = read_split(converted, split)
        assert len(records) == m.num_examples(split)
        for rec in records:
            name = rec["image/filename"].decode()
            synset = rec["image/class/synset"].decode()
            assert synset in name and rec["image/class/label"][0] == 1 + SYNSETS.index(synset)
            assert rec["image/format"] == b"JPEG" and rec["image/colorspace"] == b"RGB"
            assert rec["image/channels"][0] == 3
            encoded = rec["image/encoded"]
            with open(sources[name], "rb") as f:
                original = f.read()
            im = Image.open(io.BytesIO(encoded))
            assert (im.format, im.mode) == ("JPEG", "RGB")
            assert (rec["image/height"][0], rec["image/width"][0]) == (im.height, im.width)
            if encoded != original:  # only the PNG, CMYK and grayscale files are re-encoded
                reencoded += 1
                assert Image.open(sources[name]).mode in ("RGBA", "RGB", "CMYK", "L") and "_0." in name
    assert reencoded == 3


def test_index_matches_tfrecord2idx_and_manifest(converted, tmp_path):
    m = load_manifest(converted)
    for split in ("train", "validation"):
        for s in m.shards(split):
            ref = tmp_path / (s.file + ".ref")
            create_index(os.path.join(converted, s.file), str(ref))
            with open(os.path.join(converted, s.index)) as f:
                assert f.read() == ref.read_text()
            assert os.path.getsize(os.path.join(converted, s.file)) == s.bytes
            assert s.checksum.startswith("crc32c:")
    assert not [n for n in os.listdir(converted) if n.endswith(".tmp")]


def test_train_shuffled_across_shards_with_fixed_seed(tiny_imagefolder, converted, tmp_path):
    labels = [r["image/class/label"][0] for r in read_split(converted, "train")]
    assert labels != sorted(labels)
    again = str(tmp_path / "again")
    imagenet_to_tfrecord.convert(tiny_imagefolder, again, train_shards=3, val_shards=2, workers=0, progress=False)
    for s in load_manifest(converted).shards("train"):
        with open(os.path.join(converted, s.file), "rb") as a, open(os.path.join(again, s.file), "rb") as b:
            assert a.read() == b.read()


@pytest.mark.parametrize("style", ["kaggle", "plain"])
def test_flat_validation_with_labels_file(tiny_imagefolder, tmp_path, style):
    src = tmp_path / "src"
    os.makedirs(src / "val")
    os.symlink(os.path.join(tiny_imagefolder, "train"), src / "train")
    lines = ["ImageId,PredictionString"] if style == "kaggle" else []
    for synset in SYNSETS:
        d = os.path.join(tiny_imagefolder, "val", synset)
        for n in sorted(os.listdir(d)):
            os.symlink(os.path.join(d, n), src / "val" / n)
            stem = os.path.splitext(n)[0]
            lines.append(f"{stem},{synset} 1 2 3 4" if style == "kaggle" else f"{n} {synset}")
    (src / "labels.txt").write_text("\n".join(lines) + "\n")
    out = str(tmp_path / "out")
    imagenet_to_tfrecord.convert(
        str(src), out, train_shards=2, val_shards=1, workers=0, val_labels=str(src / "labels.txt"), progress=False
    )
    records = read_split(out, "validation")
    assert len(records) == 3 * TINY_VAL_PER_CLASS
    for rec in records:
        synset = rec["image/filename"].decode().split("_")[0]
        assert rec["image/class/label"][0] == 1 + SYNSETS.index(synset)


def test_make_index_num_classes_option(converted, tmp_path):
    for n in os.listdir(converted):
        if n.startswith("validation-") and not n.endswith(".idx"):
            os.link(os.path.join(converted, n), tmp_path / n)  # a copy: a link out of the folder is refused
    m = make_index.make_index(str(tmp_path), num_classes=1000)
    assert m.num_classes == 1000 and "train" not in m.splits


def test_demo_dataset_is_built_and_idempotent(demo_data):
    m = load_manifest(demo_data)
    assert (m.num_examples("train"), m.num_examples("validation"), m.num_classes) == (1437, 360, 10)
    before = os.stat(os.path.join(demo_data, "dataset.json")).st_mtime_ns
    t = time.perf_counter()
    r = call_main("data_tools.make_demo_dataset", demo_data)
    assert r.returncode == 0, r.stderr
    assert time.perf_counter() - t < 30
    assert os.stat(os.path.join(demo_data, "dataset.json")).st_mtime_ns == before


def test_bench_dataset_is_imagenet_like(tmp_path):
    make_bench_dataset.make_bench_dataset(str(tmp_path), num_images=12, classes=3, val_fraction=0.25)
    files = [os.path.join(d, n) for d, _, ns in os.walk(tmp_path / "train") for n in ns]
    assert len(files) == 9 and len(os.listdir(tmp_path / "train")) == 3
    sizes = {Image.open(f).size for f in files}
    assert len(sizes) > 1 and all(200 <= w <= 640 and 150 <= h <= 640 for w, h in sizes)
    assert json.loads((tmp_path / "bench.json").read_text())["num_images"] == 12


# --- one shard set at a time --------------------------------------------------------------------


def test_reconversion_with_another_shard_count_replaces_the_old_set(tiny_imagefolder, tmp_path):
    out = tmp_path / "out"
    imagenet_to_tfrecord.convert(tiny_imagefolder, str(out), train_shards=3, val_shards=2, workers=0, progress=False)
    (out / "notes.tmp").write_text("someone else's")  # not ours: must survive
    (out / "train-00002-of-00003.tmp").write_text("leftover of the old set")
    imagenet_to_tfrecord.convert(tiny_imagefolder, str(out), train_shards=4, val_shards=2, workers=0, progress=False)
    shards = sorted(n for n in os.listdir(out) if n.startswith("train-"))
    assert shards == [f"train-0000{i}-of-00004{ext}" for i in range(4) for ext in ("", ".idx")]
    assert not [n for n in os.listdir(out / ".progress") if "of-00003" in n]
    assert (out / "notes.tmp").read_text() == "someone else's"
    # What the docs advise for a stale index now sees one set: 18 images, not 18 + 18.
    assert make_index.make_index(str(out)).num_examples("train") == 3 * TINY_TRAIN_PER_CLASS


def test_converter_refuses_shards_it_did_not_write(tiny_imagefolder, converted, tmp_path):
    out = tmp_path / "out"
    os.makedirs(out)
    foreign = out / "train-00000-of-00007"
    foreign.write_bytes(open(os.path.join(converted, "train-00000-of-00003"), "rb").read())
    with pytest.raises(imagenet_to_tfrecord.UserError) as e:
        imagenet_to_tfrecord.convert(
            tiny_imagefolder, str(out), train_shards=3, val_shards=2, workers=0, progress=False
        )
    assert str(e.value).startswith(f"{foreign}: shards this conversion does not write") and "--out" in str(e.value)
    assert sorted(n for n in os.listdir(out) if not n.startswith(".")) == ["train-00000-of-00007"]


def test_make_index_refuses_mixed_sets_and_missing_shards(converted, tmp_path):
    d = tmp_path / "d"
    os.makedirs(d)
    for n in os.listdir(converted):
        if n.startswith("train-") and not n.endswith(".idx"):
            os.link(os.path.join(converted, n), d / n)
    os.link(os.path.join(converted, "train-00000-of-00003"), d / "train-00000-of-00001")
    r = call_main("data_tools.make_index", str(d))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: {d}: 2 train shard sets, train-*-of-00001 (1 file) and train-*-of-00003 (3 files); delete the "
        f"set you do not want (or convert into an empty --out), then rerun python -m data_tools.make_index {d}"
    )
    os.remove(d / "train-00000-of-00001")
    os.remove(d / "train-00001-of-00003")
    with pytest.raises(make_index.UserError, match="train-\\*-of-00003 set lacks train-00001-of-00003; restore"):
        make_index.make_index(str(d))
    assert not [n for n in os.listdir(d) if n.endswith((".idx", ".json"))]  # nothing written


# --- a re-conversion that stops part-way (issue 36 item 1) ---------------------------------------


def distinct_images(out: str) -> tuple[int, int]:
    """(records, distinct (class, file name) pairs) over the train shards dataset.json lists."""
    recs = read_split(out, "train")
    return len(recs), len({(bytes(r["image/class/synset"]), bytes(r["image/filename"])) for r in recs})


def test_a_failed_reconversion_never_leaves_a_manifest_that_disagrees_with_the_shards(tiny_imagefolder, tmp_path):
    from data_tools import imagefolder
    from tests.helpers.data_fixtures import copy_imagefolder, corrupt_jpeg_bytes
    from vitlarge.data.manifest import validate_data_dir
    from vitlarge.errors import UserError

    src = copy_imagefolder(tiny_imagefolder, str(tmp_path / "src"))
    out = str(tmp_path / "out")
    imagenet_to_tfrecord.convert(src, out, train_shards=3, val_shards=1, workers=0, progress=False)
    # New images for the second conversion (every train shard changes), and a bad JPEG placed in the last
    # shard of the new plan: shards 0 and 1 are replaced before the conversion stops.
    for synset in SYNSETS:
        d = os.path.join(src, "train", synset)
        first = sorted(os.listdir(d))[-1]
        with open(os.path.join(d, first), "rb") as f, open(os.path.join(d, "new_" + first), "wb") as g:
            g.write(f.read())
    for i in range(3 * 26):  # names that sort to other places shuffle to other shards
        bad = os.path.join(src, "train", SYNSETS[i % 3], f"{chr(ord('a') + i // 3)}_bad.JPEG")
        with open(bad, "wb") as f:
            f.write(corrupt_jpeg_bytes())
        _, splits = imagefolder.discover(src, None, 1)
        plan = imagenet_to_tfrecord.plan_shards(splits["train"], 3, "train", 0)
        if any(it.path == bad for it in plan[2][1]):
            break
        os.remove(bad)
    with pytest.raises(UserError, match="unreadable image"):
        imagenet_to_tfrecord.convert(src, out, train_shards=3, val_shards=1, workers=0, progress=False)
    if os.path.exists(os.path.join(out, "dataset.json")):  # a manifest left behind must describe the shards
        validate_data_dir(out)
        assert distinct_images(out)[0] == distinct_images(out)[1]
    with pytest.raises(UserError) as e:  # what the loader says
        validate_data_dir(out)
    assert str(e.value) == (
        f"{out}/dataset.json: missing; a conversion into {out} did not finish (it writes dataset.json last): rerun "
        "it with the same arguments (python -m data_tools.imagenet_to_tfrecord ...); it keeps complete shards and "
        f"redoes the rest; if every shard is there (a copy that left it out), python -m data_tools.make_index {out} "
        "writes it"
    )
    # What the loader's message advises (make_index) refuses the mixture, naming both conversions.
    with pytest.raises(UserError) as e:
        make_index.make_index(out)
    msg = str(e.value)
    assert msg.startswith(f"{out}: holds shards of 2 conversions under one set of names: ") and "\n" not in msg
    assert len(set(re.findall(rf"of conversion ([0-9a-f]{{12}}) from {re.escape(src)} \(train-", msg))) == 2, msg
    assert "rerun the conversion you want" in msg
    assert not os.path.exists(os.path.join(out, "dataset.json"))
    os.remove(bad)  # the fix: the rerun resumes and finishes the new conversion
    imagenet_to_tfrecord.convert(src, out, train_shards=3, val_shards=1, workers=0, progress=False)
    assert distinct_images(out) == (3 * TINY_TRAIN_PER_CLASS + 3,) * 2
    assert make_index.make_index(out).num_examples("train") == 3 * TINY_TRAIN_PER_CLASS + 3


# --- the validation split sorted by aspect ratio, with its sizes ---------------------------------


def test_validation_is_written_sorted_by_aspect_with_each_images_size(tiny_imagefolder, converted):
    """The records are the source's validation images (each once), by width / height; dataset.json lists their
    sizes in record order (those of the records themselves) and says so; the training split has none."""
    m = load_manifest(converted)
    records = read_split(converted, "validation")
    sizes = [(r["image/height"][0], r["image/width"][0]) for r in records]
    assert len(set(w / h for h, w in sizes)) > 3  # the tiny tree's crops vary: the order is a real sort
    assert [w / h for h, w in sizes] == sorted(w / h for h, w in sizes)
    assert split_sizes(m, "validation").tolist() == [list(x) for x in sizes]
    assert m.order == {"validation": "aspect"} and split_sizes(m, "train") is None
    val_files = sorted(n for n, p in files_by_name(tiny_imagefolder).items() if f"{os.sep}val{os.sep}" in p)
    assert sorted(r["image/filename"].decode() for r in records) == val_files


def test_reconverting_a_data_set_without_sizes_rewrites_only_the_validation_shards(
    tiny_imagefolder, tmp_path, monkeypatch
):
    """A data set converted before the sizes were recorded (its validation split in file order, no sizes in its
    done-records or manifest): rectangular validation refuses it with the command; that command keeps every
    training shard as it is and rewrites the validation shards, sorted, with their sizes."""
    from data_tools import val_order
    from vitlarge.data.rect import val_sizes
    from vitlarge.errors import UserError

    out = tmp_path / "out"
    with monkeypatch.context() as m:  # the converter as it was: the validation split in the order found
        m.setattr(val_order, "aspect_sorted", lambda items, max_pixels=0: list(items))
        imagenet_to_tfrecord.convert(
            tiny_imagefolder, str(out), train_shards=3, val_shards=2, workers=0, progress=False
        )
    doc = json.loads((out / "dataset.json").read_text())
    doc["splits"]["validation"].pop("order", None)  # where the file order happens to be sorted
    for shard in doc["splits"]["validation"]["shards"]:
        del shard["sizes"]
        record = out / ".progress" / f"{shard['file']}.json"
        record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "sizes"}))
    (out / "dataset.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match="validation split is not stored sorted by aspect ratio"):
        val_sizes(load_manifest(str(out)))
    train = {s.file: os.stat(out / s.file).st_ino for s in load_manifest(str(out)).shards("train")}
    imagenet_to_tfrecord.convert(tiny_imagefolder, str(out), train_shards=3, val_shards=2, workers=0, progress=False)
    m = load_manifest(str(out))
    assert {s.file: os.stat(out / s.file).st_ino for s in m.shards("train")} == train  # kept, not rewritten
    sizes = val_sizes(m).tolist()
    assert sizes == [[r["image/height"][0], r["image/width"][0]] for r in read_split(str(out), "validation")]
    assert [w / h for h, w in sizes] == sorted(w / h for h, w in sizes)


def test_make_index_records_the_validation_sizes_and_finds_their_order(converted, tmp_path):
    """make_index on the converter's output writes its manifest again, sizes and order included; on validation
    shards in another order (TensorFlow's) the sizes without the order."""
    for n in os.listdir(converted):
        if n.startswith(("train-", "validation-")) and not n.endswith(".idx"):
            os.link(os.path.join(converted, n), tmp_path / n)
    again = make_index.make_index(str(tmp_path))
    ours = load_manifest(converted)
    assert again.order == {"validation": "aspect"}
    assert again.shards("validation") == ours.shards("validation") and again.shards("train") == ours.shards("train")
    unsorted = tmp_path / "unsorted"
    unsorted.mkdir()
    os.link(tmp_path / "validation-00000-of-00002", unsorted / "validation-00001-of-00002")  # swapped: out of order
    os.link(tmp_path / "validation-00001-of-00002", unsorted / "validation-00000-of-00002")
    m = make_index.make_index(str(unsorted))
    assert m.order == {} and split_sizes(m, "validation") is not None


# --- the image tree's shapes: subfolders in a class, few images, a class validation lacks ---------------------


def labels_in(out: str, split: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for rec in read_split(out, split):
        counts[rec["image/class/label"][0]] = counts.get(rec["image/class/label"][0], 0) + 1
    return counts


@pytest.mark.parametrize("moved", ["all", "some"])
def test_images_in_subfolders_of_a_class_folder_are_that_class(tiny_imagefolder, tmp_path, moved):
    """All of a class under train/<wnid>/sub/, or some of it two levels down (and a val class's too): every image
    is converted, labelled by the class folder that holds it."""
    src = copy_imagefolder(tiny_imagefolder, str(tmp_path / "src"))
    for split, cls in (("train", SYNSETS[1]), ("val", SYNSETS[2])):
        folder = os.path.join(src, split, cls)
        names = sorted(os.listdir(folder))
        sub = os.path.join(folder, "sub") if moved == "all" else os.path.join(folder, "part2", "more")
        os.makedirs(sub)
        for n in names if moved == "all" else names[::2]:
            os.rename(os.path.join(folder, n), os.path.join(sub, n))
    out = str(tmp_path / "out")
    m = imagenet_to_tfrecord.convert(src, out, train_shards=2, val_shards=1, workers=0, progress=False)
    assert labels_in(out, "train") == {1 + i: TINY_TRAIN_PER_CLASS for i in range(3)}
    assert labels_in(out, "validation") == {1 + i: TINY_VAL_PER_CLASS for i in range(3)}
    assert m.num_classes == 3


def test_links_in_a_class_folder_are_followed_once_and_a_loop_is_refused(tiny_imagefolder, tmp_path):
    from vitlarge.errors import UserError

    src = copy_imagefolder(tiny_imagefolder, str(tmp_path / "src"))
    elsewhere = tmp_path / "more"
    os.makedirs(elsewhere)
    shutil.copy(
        os.path.join(src, "train", SYNSETS[0], sorted(os.listdir(os.path.join(src, "train", SYNSETS[0])))[-1]),
        elsewhere / "x.JPEG",
    )
    for n in ("a", "b"):  # two links to one folder: its image once
        os.symlink(elsewhere, os.path.join(src, "train", SYNSETS[0], n))
    classes, splits = imagefolder.discover(src, None, 1)
    assert len(splits["train"]) == 3 * TINY_TRAIN_PER_CLASS + 1
    said = [w for w in imagefolder.layout_warnings(src, classes, splits, 1) if "through links" in w]
    assert said == [  # followed, and said: a downloaded tree may carry links out
        f"1 image is read through links to outside {src} ({src}/train/{SYNSETS[0]}/a/x.JPEG -> {elsewhere}/x.JPEG); "
        "they are converted as their class's images: remove the links if that is not intended"
    ]
    loop = os.path.join(src, "train", SYNSETS[0], "a", "loop")
    os.symlink(os.path.join(src, "train"), loop)  # the class folder's parent: the other classes too
    with pytest.raises(UserError) as e:
        imagefolder.discover(src, None, 1)
    assert str(e.value).startswith(f"{loop}: links to {src}/train, which holds the class folder ")


def test_a_class_with_one_image_and_a_class_missing_from_val_are_each_warned_once(tiny_imagefolder, tmp_path):
    src = copy_imagefolder(tiny_imagefolder, str(tmp_path / "src"))
    lone = os.path.join(src, "train", "n09999999")
    os.makedirs(lone)
    first = sorted(os.listdir(os.path.join(src, "train", SYNSETS[1])))[-1]
    shutil.copy(os.path.join(src, "train", SYNSETS[1], first), os.path.join(lone, "only.JPEG"))
    args = ["--src", src, "--workers", "0", "--no-progress"]
    r = call_main("data_tools.imagenet_to_tfrecord", *args, "--out", str(tmp_path / "a"), "--min-class-images", "5")
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("warning")] == [
        f"warning: 1 of 4 classes has fewer than 5 training images (n09999999: 1) in {src}/train; add images or "
        "remove the class (--min-class-images N sets this threshold)",
        f"warning: 1 of 4 classes has no validation image (n09999999): validation does not measure it; add images "
        f"to {src}/val if that is not intended",
    ]
    assert load_manifest(str(tmp_path / "a")).num_examples("train") == 3 * TINY_TRAIN_PER_CLASS + 1
    r = call_main("data_tools.imagenet_to_tfrecord", *args, "--out", str(tmp_path / "b"))  # the default threshold
    few = ", ".join(f"{s}: {TINY_TRAIN_PER_CLASS}" for s in SYNSETS)
    assert f"warning: 4 of 4 classes have fewer than 10 training images ({few}, n09999999: 1) in" in r.stderr
    assert r.stderr.count("warning: ") == 2


def test_make_index_keeps_the_converters_count_of_skipped_images(tiny_imagefolder, tmp_path):
    from tests.helpers.data_fixtures import corrupt_jpeg_bytes

    src = copy_imagefolder(tiny_imagefolder, str(tmp_path / "src"))
    with open(os.path.join(src, "train", SYNSETS[1], "zz_corrupt.JPEG"), "wb") as f:
        f.write(corrupt_jpeg_bytes())
    out = str(tmp_path / "out")
    kw = dict(train_shards=2, val_shards=1, workers=0, progress=False, skip_bad=True)
    assert imagenet_to_tfrecord.convert(src, out, **kw).skipped == {"train": 1, "validation": 0}
    assert make_index.make_index(out).skipped.get("train") == 1  # over the converter's own dataset.json
    os.remove(os.path.join(out, "dataset.json"))  # a copy that left it out: the done-records say
    assert make_index.make_index(out).skipped.get("train") == 1
    shutil.rmtree(os.path.join(out, ".progress"))  # a copy without them: the dataset.json it replaces says
    assert make_index.make_index(out).skipped.get("train") == 1
    os.remove(os.path.join(out, "dataset.json"))  # neither: shards made elsewhere, nothing known to be skipped
    assert make_index.make_index(out).skipped.get("train", 0) == 0


@pytest.mark.parametrize("link", ["class folder", "subfolder", "file", "outside, from two classes"])
def test_a_link_that_puts_an_image_under_two_classes_or_twice_is_one_line_naming_it(tiny_imagefolder, tmp_path, link):
    """``train/a/extra -> ../b`` stored b's images as class a too, without a word (only links out of --src were
    named): a link that makes an image reachable twice, under another class or the same, is refused in one line
    naming the link, before anything is written."""
    from vitlarge.errors import UserError

    src = copy_imagefolder(tiny_imagefolder, str(tmp_path / "src"))
    a, b = (os.path.join(src, "train", c) for c in SYNSETS[:2])
    first_b = os.path.join(b, sorted(os.listdir(b))[0])
    if link == "class folder":
        at = os.path.join(src, "train", "n09999999")
        os.symlink(b, at)
        words = f"which would be stored as class 'n09999999' and as class '{SYNSETS[1]}' (a mislabel)"
    elif link == "subfolder":
        at = os.path.join(a, "extra")
        os.symlink(os.path.join("..", SYNSETS[1]), at)
        words = f"which would be stored as class '{SYNSETS[0]}' and as class '{SYNSETS[1]}' (a mislabel)"
    elif link == "file":
        at = os.path.join(b, "again.JPEG")
        os.symlink(first_b, at)
        words = f"which would be stored twice in class '{SYNSETS[1]}'"
    else:
        outside = tmp_path / "pool"
        outside.mkdir()
        shutil.copy(first_b, outside / "x.JPEG")
        os.symlink(outside, os.path.join(a, "pool"))
        at = os.path.join(b, "pool")  # both are links: the second found is named
        os.symlink(outside, at)
        words = f"which would be stored as class '{SYNSETS[1]}' and as class '{SYNSETS[0]}' (a mislabel)"
    with pytest.raises(UserError) as e:
        imagenet_to_tfrecord.convert(src, str(tmp_path / "out"), workers=0, progress=False)
    assert str(e.value).startswith(f"{at}: a link that makes ") and words in str(e.value), str(e.value)
    assert str(e.value).endswith("; remove the link, or copy the image where it belongs")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("layout", ["val", None], ids=["ROOT/val/<class>", "ROOT/<class>"])
def test_a_folder_without_train_converts_to_a_validation_split_to_evaluate_on(tmp_path, capsys, layout):
    """Issue 55: a test folder of images could not be converted (``train/`` missing; the workaround was a
    ``train -> val`` link and converting twice). It is now a validation split alone, said in one line; training
    on it is refused in one line naming the missing split (evaluating on it: tests/e2e/test_evaluate.py)."""
    from tests.helpers.data_fixtures import make_colour_folder
    from vitlarge.config.load import load_config
    from vitlarge.data.sources import checked_manifest
    from vitlarge.errors import UserError

    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    make_colour_folder(src, {"1": 0, "2": 120, "10": 240}, 3, layout)
    m = imagenet_to_tfrecord.convert(src, out, workers=0, progress=False)
    assert list(m.splits) == ["validation"] and m.num_examples("validation") == 9
    assert [c.synset for c in m.classes] == ["1", "10", "2"]  # sorted as text, as a training split's are
    folder = os.path.join(src, "val") if layout else src
    assert (
        f"{src} has no train/: converting the 3 class folders of {folder} as a validation split only, to evaluate on "
        f"(vitlarge-evaluate --data {out}); training needs ROOT/train/<class>/*"
    ) in capsys.readouterr().err.splitlines()
    cfg = load_config(ROOT / "recipes" / "demo_digits.py", ["data.num_classes=3"], data__path=out)
    with pytest.raises(UserError) as e:
        checked_manifest(cfg)
    assert str(e.value) == (
        f"{out}/dataset.json: a validation split only (converted to evaluate on, vitlarge-evaluate --data): training "
        "needs a 'train' split; convert ROOT/train/<class>/* into it"
    )


def test_a_folder_with_neither_train_nor_class_folders_is_one_line(tmp_path):
    from vitlarge.errors import UserError

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.jpg").write_bytes(b"")
    with pytest.raises(
        UserError, match=r"/src/train: missing; the source needs ROOT/train/<class>/\* .* ROOT/<class>/\*$"
    ):
        imagenet_to_tfrecord.convert(str(tmp_path / "src"), str(tmp_path / "out"), workers=0, progress=False)


@pytest.mark.parametrize("split, out", [(None, "tfrecords"), ("val", "val/tfrecords"), ("train", "train/tfrecords")])
def test_an_out_inside_the_folder_of_class_folders_is_refused_before_anything_is_removed(tmp_path, split, out):
    """Review of issue 55: a flat set converted to ``--out SRC/tfrecords`` read tfrecords/ as a class on the rerun,
    removed the good dataset.json, then failed on it as an unreadable image. Refused in one line, exit 2, before
    anything is read or removed: where the class folders are read (``SRC``, ``SRC/val``, ``SRC/train``)."""
    from tests.helpers.data_fixtures import make_colour_folder

    src = tmp_path / "src"
    make_colour_folder(str(src), {"one": 0, "two": 90}, 2, split)
    if split == "train":
        make_colour_folder(str(src), {"one": 0, "two": 90}, 2, "val")
    dest = src / out
    dest.mkdir()
    (dest / "dataset.json").write_text("{}")  # an earlier conversion's, left as it is
    r = call_main("data_tools.imagenet_to_tfrecord", "--src", str(src), "--out", str(dest), "--workers", "0")
    folder = src / (split or "")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (
        f"error: {dest}: --out is inside {os.path.normpath(folder)}, whose folders are read as classes; choose an "
        "--out outside it\n"
    )
    assert (dest / "dataset.json").read_text() == "{}"


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        # an image labelled twice, differently: the last line won silently (a validation label changed, exit 0)
        (
            b"a0 n01\na1 n01\na0 n02\n",
            "labels.txt:3: a0 is labelled n02 here and n01 on line 1; keep one line per image",
        ),
        (
            b"ImageId,PredictionString\na0,n01 1 2 3 4\na0,n02 1 2 3 4\n",
            "labels.txt:3: a0 is labelled n02 here and n01 on line 2",
        ),
        # a Kaggle row without its PredictionString: AttributeError; bytes that are no UTF-8: UnicodeDecodeError
        (b"ImageId,PredictionString\na0,n01 1 2 3 4\na1\n", "labels.txt:3: expected 'ImageId,PredictionString'"),
        (b"a0 n01\na1 \xff\xfen01\n", "labels.txt: not UTF-8 text"),
    ],
)
def test_a_validation_labels_file_from_elsewhere_is_data(tmp_path, content, expect):
    path = tmp_path / "labels.txt"
    path.write_bytes(content)
    with pytest.raises(UserError) as e:
        imagefolder.read_val_labels(str(path))
    assert expect in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_validation_labels_file_is_read_up_to_its_cap(tmp_path):
    path = tmp_path / "labels.txt"
    with open(path, "wb") as f:  # one line of 2 GiB, sparse: read whole by readline() before (2 GiB and more)
        f.truncate(2 << 30)
    with pytest.raises(UserError, match=r"labels\.txt is larger than the [\d,]+-byte cap"):
        imagefolder.read_val_labels(str(path))


def test_the_same_label_twice_and_a_bom_are_fine(tmp_path):
    path = tmp_path / "labels.txt"
    path.write_bytes("\ufeffImageId,PredictionString\na0,n01 1 2\na0,n01 5 6\na1,n02 1 2\n".encode())
    assert imagefolder.read_val_labels(str(path)) == {"a0": "n01", "a1": "n02"}
