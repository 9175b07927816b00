"""dataset.json at ImageNet-21K's scale: what it holds grows with classes and shards, never with images (the images'
sizes are in files beside it), so every manifest its writers write, its readers read."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import tracemalloc

import numpy as np
import pytest

from vitlarge.data.manifest import (
    MANIFEST_CAP,
    MAX_SIZED_RECORDS,
    ClassInfo,
    Manifest,
    ShardInfo,
    load_manifest,
    split_sizes,
    write_manifest,
)
from vitlarge.data.manifest_schema import VERSIONS
from vitlarge.errors import UserError

IMAGENET_21K = {"classes": 21_841, "train": 14_197_122, "validation": 1_500_000}


def shards(split: str, records: int, count: int, sized: bool = False) -> list[ShardInfo]:
    """``count`` shards of ``records`` in all; with ``sized``, shard ``i``'s images are all ``(300, 500 + i)``
    pixels (height, width): the split is in aspect order."""
    out = []
    for i in range(count):
        n = records * (i + 1) // count - records * i // count
        name = f"{split}-{i:05d}-of-{count:05d}"
        sizes = ((300, 500 + i),) * n if sized else None
        out.append(ShardInfo(name, name + ".idx", n, n * 110_000, "crc32c:1a2b3c4d", sizes))
    return out


def test_an_imagenet_21k_manifest_with_its_validation_sizes_is_written_and_read_back(tmp_path):
    """21,841 classes, 14.2M training images in 1,024 shards and 1.5M validation images with their sizes (in 16
    shards: each sizes file is written with an fsync): make_index wrote 27 MB of JSON for this, which its reader
    refused (a 16 MiB cap) and told to run make_index again."""
    m = Manifest(
        num_classes=IMAGENET_21K["classes"],
        label_offset=1,
        classes=[ClassInfo(i + 1, f"n{i:08d}", "a lemma, another lemma, a third") for i in range(21_841)],
        splits={
            "train": shards("train", IMAGENET_21K["train"], 1024),
            "validation": shards("validation", IMAGENET_21K["validation"], 16, sized=True),
        },
        order={"validation": "aspect"},
        tool="data_tools.make_index",
    )
    write_manifest(m, str(tmp_path))
    size = os.path.getsize(tmp_path / "dataset.json")
    assert size < MANIFEST_CAP / 4, size  # ~2.4 MB
    back = load_manifest(str(tmp_path))
    assert (back.num_classes, back.num_examples("train"), back.num_examples("validation")) == tuple(
        IMAGENET_21K.values()
    )
    read = split_sizes(back, "validation")
    assert read is not None and read.shape == (IMAGENET_21K["validation"], 2)
    assert (
        tuple(read[0]) == (300, 500)
        and tuple(read[-1]) == (300, 515)
        and np.array_equal(read, list(itertools.chain.from_iterable(s.sizes for s in m.splits["validation"])))
    )
    assert os.path.getsize(tmp_path / "validation-00000-of-00016.sizes") == 8 * (IMAGENET_21K["validation"] // 16)


def test_a_sizes_file_from_elsewhere_is_one_line_naming_it(tmp_path):
    """A sizes file is data: short, a side of 0 or out of the split's aspect order is one line naming it."""
    m = Manifest(3, 1, [], {"validation": shards("validation", 4, 1)}, order={"validation": "aspect"})
    m.splits["validation"][0] = dataclasses.replace(
        m.splits["validation"][0], sizes=((10, 10), (10, 20), (10, 30), (10, 40))
    )
    write_manifest(m, str(tmp_path))
    path = tmp_path / "validation-00000-of-00001.sizes"
    good = path.read_bytes()
    os.utime(path, ns=(1, 1))  # each rewrite below gets a new time: read again, never the copy held from before
    assert split_sizes(load_manifest(str(tmp_path)), "validation").tolist() == [[10, 10], [10, 20], [10, 30], [10, 40]]
    for data, words in [
        (good[:-8], "24 bytes, not 8 for each of the 4 records of validation-00000-of-00001"),
        (good[:8] + bytes(8) + good[16:], "a side outside 1..1048576 pixels"),
        (good[8:16] + good[:8] + good[16:], "validation record 1 (10 x 10) is narrower than the one before it"),
    ]:
        path.write_bytes(data)  # a new time and size, or (same size) a new time: read again
        with pytest.raises(UserError) as e:
            split_sizes(load_manifest(str(tmp_path)), "validation")
        assert len(str(e.value).splitlines()) == 1 and words in str(e.value), str(e.value)
    os.remove(path)
    os.symlink(tmp_path.parent / "elsewhere", path)
    with pytest.raises(UserError, match="leads outside"):
        split_sizes(load_manifest(str(tmp_path)), "validation")


def test_a_manifest_over_the_cap_is_never_written(tmp_path):
    """The writer takes the reader's cap: a manifest its readers would refuse is one line saying what it holds, and no
    dataset.json (nor a sizes file) is left, so no rerun of make_index can loop on it."""
    m = Manifest(1, 1, [ClassInfo(1, "n0", "x" * 4000)] * 5000, {"train": shards("train", 10, 1)})
    with pytest.raises(UserError) as e:
        write_manifest(m, str(tmp_path))
    assert str(e.value).startswith(f"{tmp_path / 'dataset.json'}: would be ")
    assert "more than the 16,777,216-byte cap its readers take (5,000 classes, 1 shard;" in str(e.value)
    assert os.listdir(tmp_path) == []
    assert json.loads(Manifest(1, 1, [], {"train": shards("train", 10, 1)}).to_json())["num_classes"] == 1


def _sized_manifest(tmp_path) -> str:
    m = Manifest(3, 1, [], {"validation": shards("validation", 2, 1, sized=True)}, order={"validation": "aspect"})
    write_manifest(m, str(tmp_path))
    return str(tmp_path / "dataset.json")


def test_sizes_in_files_are_format_version_2_and_a_folder_without_them_stays_1(tmp_path):
    """A reader of version 1 does not know a sizes file: a manifest naming one is version 2 (an older vitlarge then
    refuses it rather than telling its user to rewrite it with its own make_index); one without stays 1, and this
    vitlarge reads both."""
    (tmp_path / "sized").mkdir()
    (tmp_path / "plain").mkdir()
    assert json.loads(open(_sized_manifest(tmp_path / "sized")).read())["format_version"] == 2
    write_manifest(Manifest(3, 1, [], {"train": shards("train", 4, 1)}), str(tmp_path / "plain"))
    assert json.loads((tmp_path / "plain" / "dataset.json").read_text())["format_version"] == 1
    assert load_manifest(str(tmp_path / "plain")).num_examples("train") == 4
    assert split_sizes(load_manifest(str(tmp_path / "sized")), "validation") is not None


def test_a_manifest_newer_than_this_vitlarge_says_update_vitlarge_never_make_index(tmp_path):
    path = _sized_manifest(tmp_path)
    doc = json.loads(open(path).read())
    doc.update(format_version=VERSIONS[-1] + 1, a_later_key=1)
    with open(path, "w") as f:
        json.dump(doc, f)
    with pytest.raises(UserError) as e:
        load_manifest(str(tmp_path))
    text = str(e.value)
    assert len(text.splitlines()) == 1 and text.startswith(
        f"{path}: format version {VERSIONS[-1] + 1}, newer than this vitlarge"
    )
    assert "update vitlarge" in text and "make_index" not in text, text


@pytest.mark.parametrize("name", ["dataset.json", "validation-00000-of-00001.idx", "other.sizes", "notes.txt"])
def test_a_shards_sizes_entry_names_only_its_own_sizes_file(tmp_path, name):
    """The writer names a shard's sizes ``<shard>.sizes`` and nothing else: another file of the folder is never read
    as sizes."""
    path = _sized_manifest(tmp_path)
    if not (tmp_path / name).exists():
        (tmp_path / name).write_bytes(bytes(16))  # 8 bytes a record: only its name is wrong
    text = open(path).read().replace('"validation-00000-of-00001.sizes"', json.dumps(name))
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(UserError, match=r"sizes is '.*', expected validation-00000-of-00001\.sizes"):
        load_manifest(str(tmp_path))


def test_a_splits_sizes_are_held_in_8_bytes_a_record_and_read_once_per_process(tmp_path):
    """1,000,000 validation sizes in 4 files: held as an (n, 2) uint32 array, 8 bytes a record (a list of tuples took
    ~146 bytes a record: 4.9 GB a rank at the old 33.5M-record bound), and the run's pre-flight and its validation
    loader, each loading the manifest, share one read. A sizes file rewritten in place is read again."""
    n, count = 1_000_000, 4
    m = Manifest(3, 1, [], {"validation": shards("validation", n, count)}, order={"validation": "aspect"})
    for i, s in enumerate(m.splits["validation"]):
        m.splits["validation"][i] = dataclasses.replace(s, sizes_file=s.file + ".sizes")
        np.tile(np.array([300, 500 + i], dtype="<u4"), s.num_records).tofile(tmp_path / (s.file + ".sizes"))
        os.utime(tmp_path / (s.file + ".sizes"), ns=(1, 1))  # the rewrite below gets a new time, however coarse
    write_manifest(m, str(tmp_path))
    tracemalloc.start()
    try:
        first = split_sizes(load_manifest(str(tmp_path)), "validation")
        peak = tracemalloc.get_traced_memory()[1]
        again = split_sizes(load_manifest(str(tmp_path)), "validation")
    finally:
        tracemalloc.stop()
    assert peak < 8 * n + (12 << 20), f"{peak:,} bytes for {n:,} records' sizes"
    assert first is not None and first.shape == (n, 2) and first.dtype == np.uint32
    assert again is first and not first.flags.writeable, "one read, one copy a process, shared read-only"
    path = tmp_path / "validation-00003-of-00004.sizes"
    np.tile(np.array([300, 600], dtype="<u4"), n // count).tofile(path)
    assert tuple(split_sizes(load_manifest(str(tmp_path)), "validation")[-1]) == (300, 600)


def test_the_bound_on_sized_records_fits_imagenet_21k_validation_with_headroom():
    """The bound is what a manifest's num_records can make a rank hold: 32 MiB, ~2.8x ImageNet-21K's 1.5M."""
    assert 2 * IMAGENET_21K["validation"] < MAX_SIZED_RECORDS and 8 * MAX_SIZED_RECORDS <= 32 << 20
