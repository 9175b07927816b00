"""The parquet source in process: a Hugging Face data set (written by ``datasets``) converted to the same records as
its image folder, resumable, and its bad input one line (exit 2) with nothing written under a final name."""

from __future__ import annotations

import collections
import io
import json
import os
import shutil

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from tfrecord.reader import tfrecord_loader

from data_tools.imagefolder import BadImage
from data_tools.make_parquet_dataset import write_parquet
from tests.helpers import call_main
from vitlarge.data.manifest import load_manifest
from vitlarge.errors import UserError

CONVERT = "data_tools.imagenet_to_tfrecord"


def records(out: str, split: str) -> list[tuple]:
    m = load_manifest(out)
    got = []
    for shard in m.shards(split):
        for r in tfrecord_loader(os.path.join(out, shard.file), None):
            got.append(
                (
                    bytes(r["image/encoded"]),
                    int(r["image/class/label"][0]),
                    bytes(r["image/class/synset"]).decode(),
                    bytes(r["image/filename"]).decode(),
                    (int(r["image/height"][0]), int(r["image/width"][0])),
                )
            )
    return got


@pytest.fixture(scope="module")
def hub_set(tiny_imagefolder, tmp_path_factory) -> str:
    """The tiny tree (a PNG, a CMYK and a grey JPEG among its JPEGs) as the Hub lays it out: two files a split,
    row groups of 2 rows (a shard of 6 images takes 3)."""
    out = str(tmp_path_factory.mktemp("hub"))
    write_parquet(tiny_imagefolder, out, files_per_split=2, rows_per_group=2)
    return out


@pytest.fixture(scope="module")
def from_parquet(hub_set, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("from_parquet"))
    done = call_main(CONVERT, "--src", hub_set, "--out", out, "--workers", "0", "--no-progress", "--train-shards", "3")
    assert done.returncode == 0, done.stderr
    return out


def test_the_same_records_as_the_image_folder_and_the_class_names_from_the_metadata(
    tiny_imagefolder, tiny_converted, from_parquet
):
    for split in ("train", "validation"):
        want, got = records(tiny_converted, split), records(from_parquet, split)
        assert collections.Counter(got) == collections.Counter(want), split
    assert [c.synset for c in load_manifest(from_parquet).classes] == sorted(os.listdir(f"{tiny_imagefolder}/train"))
    # validation in the folder converter's order (by aspect ratio, sizes recorded): rect_val reads it
    assert [r[4] for r in records(from_parquet, "validation")] == [r[4] for r in records(tiny_converted, "validation")]
    assert load_manifest(from_parquet).order == load_manifest(tiny_converted).order
    assert not os.path.exists(os.path.join(from_parquet, ".progress", "validation.spill"))


def test_training_shards_mix_the_classes_the_files_hold_in_order(from_parquet):
    """The Hub's files hold the classes one after another here (each row group one class); no training shard holds
    one class only."""
    m = load_manifest(from_parquet)
    for shard in m.shards("train"):
        labels = {int(r["image/class/label"][0]) for r in tfrecord_loader(os.path.join(from_parquet, shard.file), None)}
        assert len(labels) >= 2, shard.file


def test_a_rerun_keeps_complete_shards_and_rewrites_a_removed_one(hub_set, from_parquet, tmp_path):
    out = str(tmp_path / "out")
    shutil.copytree(from_parquet, out)
    before = records(out, "train")
    os.remove(os.path.join(out, "train-00001-of-00003"))
    done = call_main(CONVERT, "--src", hub_set, "--out", out, "--workers", "0", "--no-progress", "--train-shards", "3")
    assert done.returncode == 0, done.stderr
    assert "1 shard to write" in done.stderr and "3 complete shards kept" in done.stderr
    assert records(out, "train") == before


def hub_file(tmp_path, name="train-00000-of-00001.parquet", **columns) -> str:
    src = tmp_path / "src"
    os.makedirs(src / "data", exist_ok=True)
    ds = datasets.Dataset.from_dict(
        {k: v for k, (v, _) in columns.items()}, features=datasets.Features({k: f for k, (_, f) in columns.items()})
    )
    ds.to_parquet(str(src / "data" / name))
    return str(src)


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(out, "JPEG")
    return out.getvalue()


IMAGE = ([{"bytes": jpeg(), "path": "a.JPEG"}], datasets.Image())
LABEL = ([0], datasets.ClassLabel(names=["a", "b"]))


def bad_sources(tmp_path) -> dict:
    """name -> (source folder, the words the one line must hold)."""
    no_image = hub_file(tmp_path / "no_image", label=LABEL, other=(["x"], datasets.Value("string")))
    no_label = hub_file(tmp_path / "no_label", image=IMAGE, label=([0], datasets.Value("int64")))
    outside = hub_file(tmp_path / "outside", image=IMAGE, label=([5], datasets.Value("int64")))
    meta = pq.read_schema(os.path.join(hub_file(tmp_path / "ref", image=IMAGE, label=LABEL), "data", os.listdir(tmp_path / "ref" / "src" / "data")[0])).metadata  # fmt: skip
    table = pq.read_table(os.path.join(outside, "data", "train-00000-of-00001.parquet"))
    pq.write_table(table.replace_schema_metadata(meta), os.path.join(outside, "data", "train-00000-of-00001.parquet"))
    not_image = hub_file(tmp_path / "not_image", image=([{"bytes": b"<html>", "path": "a.JPEG"}], datasets.Image()), label=LABEL)  # fmt: skip
    damaged = hub_file(tmp_path / "damaged", image=IMAGE, label=LABEL)
    path = os.path.join(damaged, "data", "train-00000-of-00001.parquet")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:4] + bytes(60) + data[64:])  # the first page header overwritten, the footer kept
    truncated = hub_file(tmp_path / "truncated", image=IMAGE, label=LABEL)
    path = os.path.join(truncated, "data", "train-00000-of-00001.parquet")
    open(path, "r+b").truncate(os.path.getsize(path) // 2)
    typed = {}
    for field, value in (("path", 7), ("bytes", "a string")):  # an int path, text bytes: a traceback before
        src = tmp_path / f"typed_{field}" / "src"
        os.makedirs(src / "data")
        image = {"bytes": jpeg(), "path": "a.JPEG", field: value}
        pq.write_table(pa.table({"image": [image], "label": [0]}).replace_schema_metadata(meta), src / "data" / "train-00000-of-00001.parquet")  # fmt: skip
        typed[f"a {field} field of another type"] = (str(src), f"the image's {field!r} is of type ")
    return {
        **typed,
        "no image column": (no_image, "no image column"),
        "no class names": (no_label, "no label column with class names"),
        "a label outside the classes": (outside, "label 5 outside the 2 classes"),
        "a non-image payload": (not_image, "a.JPEG: unreadable image"),
        "a damaged page": (damaged, "not a readable parquet file"),
        "a truncated file": (truncated, "not a readable parquet file"),
    }


def test_bad_input_is_one_line_naming_the_file_and_exit_2_with_nothing_written(tmp_path):
    for case, (src, words) in bad_sources(tmp_path).items():
        out = tmp_path / "out" / case.replace(" ", "_")
        done = call_main(CONVERT, "--src", src, "--out", str(out), "--workers", "0", "--no-progress")
        lines = [line for line in done.stderr.splitlines() if "error" in line]
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (case, done.stderr)
        assert words in lines[0] and os.path.join(src, "data", "train-00000-of-00001.parquet") in lines[0], (
            case,
            lines,
        )
        written = [n for n in (os.listdir(out) if out.exists() else []) if n != ".progress"]
        assert written == [], (case, written)


@pytest.mark.parametrize("bound", ["MAX_ROW_GROUP_BYTES", "MAX_ROW_GROUP_ROWS"])
def test_a_row_group_past_the_bound_is_refused_before_it_is_read(tmp_path, monkeypatch, bound):
    """Bytes or rows (a footer may claim billions of rows whose run-length labels take a few bytes)."""
    from data_tools import parquet_source

    src = hub_file(tmp_path, image=IMAGE, label=LABEL)
    monkeypatch.setattr(parquet_source, bound, 0 if bound.endswith("ROWS") else 100)  # the file: 1 row
    done = call_main(CONVERT, "--src", src, "--out", str(tmp_path / "out"), "--workers", "0", "--no-progress")
    assert done.returncode == 2 and "read at a time (a memory guard); rewrite it with smaller row groups" in done.stderr


def test_a_test_split_is_left_out_in_one_line(tmp_path):
    src = hub_file(tmp_path, image=IMAGE, label=LABEL)
    shutil.copy(os.path.join(src, "data", "train-00000-of-00001.parquet"), os.path.join(src, "data", "test-00000-of-00001.parquet"))  # fmt: skip
    done = call_main(CONVERT, "--src", src, "--out", str(tmp_path / "out"), "--workers", "0", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "left out 1 unlabelled file" in done.stderr
    assert json.load(open(tmp_path / "out" / "dataset.json"))["num_classes"] == 2


def test_a_set_of_validation_files_alone_converts_to_evaluate_on(tmp_path):
    src = hub_file(tmp_path, name="validation-00000-of-00001.parquet", image=IMAGE, label=LABEL)
    done = call_main(CONVERT, "--src", src, "--out", str(tmp_path / "out"), "--workers", "0", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "has no train-*.parquet: converting its validation split only" in done.stderr
    m = load_manifest(str(tmp_path / "out"))
    assert (m.num_examples("validation"), [c.synset for c in m.classes]) == (1, ["a", "b"])
    assert list(m.splits) == ["validation"]


SHARED_META = {"info": {"features": {"label": {"_type": "ClassLabel", "names": ["a", "b"]}}}}


def shared_value_file(tmp_path, rows: int, size: int, column: str = "image", **write) -> str:
    """A parquet file of ``rows`` rows whose images are all one ``size``-byte value (zeros after a JPEG marker: no
    image, and a small file where the value is stored once), written by pyarrow with ``write``."""
    import pyarrow as pa

    meta = {"info": {"features": {column: {"_type": "Image"}, **SHARED_META["info"]["features"]}}}
    value = b"\xff\xd8" + bytes(size - 2)
    table = pa.table({column: [{"bytes": value, "path": "a.jpg"}] * rows, "label": [0] * rows})
    path = str(tmp_path / "train-00000-of-00001.parquet")
    pq.write_table(table.replace_schema_metadata({"huggingface": json.dumps(meta)}), path, **write)
    return path


OPTS = {"classes": ["a", "b"], "label_offset": 0, "check": "header", "max_pixels": 1 << 20, "seed": 0}


@pytest.mark.parametrize("compression,column", [("zstd", "image"), ("none", "image"), ("zstd", "im.g")])
def test_a_value_shared_by_many_rows_is_held_once_not_once_a_row(tmp_path, compression, column):
    """A dictionary-encoded image column whose 50 rows all point at one 2 MB value: the footer says ~2 MB, read
    whole the row group expands to 100 MB (/tmp/review54/t6.py: 20 MB, 2.2 GB). The rows are read in bounded
    batches with the image bytes kept dictionary-encoded, so what Arrow holds while a shard's rows are taken stays
    near one value, not one a row; compressed or not, a chunk with a dictionary page is not read plain, nor is a
    column whose name holds a dot (its chunks' dotted paths, ``im.g.bytes``, are matched whole)."""
    import pyarrow as pa

    from data_tools import parquet_source

    rows = 50
    path = shared_value_file(
        tmp_path, rows, 2 << 20, column, dictionary_pagesize_limit=1 << 30, compression=compression
    )
    assert pq.ParquetFile(path).metadata.row_group(0).total_byte_size < 4 << 20
    reader = parquet_source.Reader(path)
    assert parquet_source.plain_bytes(reader.plain.metadata.row_group(0), reader.columns.image_leaves) is None
    held, grown, before, pool = [], [], resident(), pa.total_allocated_bytes()
    for _, image in parquet_source.shard_images([parquet_source.Piece(path, 0, 0, rows, 0)], OPTS):
        held.append(pa.total_allocated_bytes() - pool)  # Arrow's pool: the batches
        grown.append(resident() - before)  # and what Arrow copies outside its pool (a binary scalar's value)
        assert isinstance(image, BadImage), image
    assert len(held) == rows and max(held) < 25 << 20, f"{max(held):,} bytes held by Arrow"
    assert max(grown) < 50 << 20, f"{max(grown):,} bytes more resident"


@pytest.mark.parametrize(
    "write",
    [
        {"dictionary_pagesize_limit": 1 << 30},  # a dictionary page the footer hides
        {"use_dictionary": False, "column_encoding": {"image.bytes": "DELTA_BYTE_ARRAY"}},  # a prefix per value
    ],
)
def test_a_footer_that_calls_its_image_chunks_plain_reads_no_more_than_they_hold(tmp_path, write):
    """A crafted file whose footer says its uncompressed image chunks are PLAIN, without a dictionary page, while
    their pages share one 256 KiB value among 64 rows (a dictionary page, or DELTA_BYTE_ARRAY's prefixes): read
    plain, and refused in one line naming the file at the first batch that holds more than the chunks do, a few
    MiB, not the 16 MiB the rows would expand to."""
    from data_tools import parquet_source
    from tests.helpers.parquet_footer import claim_plain

    rows = 64
    path = shared_value_file(tmp_path, rows, 256 << 10, compression="none", **write)
    claim_plain(path, "image")
    reader = parquet_source.Reader(path)
    stored = parquet_source.plain_bytes(reader.plain.metadata.row_group(0), reader.columns.image_leaves)
    assert stored is not None and stored < 1 << 20  # read plain: the footer's claim
    before = resident()
    with pytest.raises(UserError) as e:
        list(parquet_source.shard_images([parquet_source.Piece(path, 0, 0, rows, 0)], OPTS))
    assert str(e.value) == (
        f"{path}: row group 0 reads as more than the {stored:,} bytes its image column holds in the file (a crafted "
        "or damaged file); download it again"
    )
    assert resident() - before < 64 << 20


def test_only_the_images_bytes_and_path_and_the_label_are_read(tmp_path):
    """Another field of the image struct holding one 2 MiB value in each of 50 rows (dictionary-encoded and
    compressed: a small file), and a column named ``image.nest`` beside it (dotted names are ambiguous: a
    column's name or a field's path): neither is read, so Arrow holds the JPEGs and labels only (4 GB from a
    47 KB file before, review 62)."""
    from data_tools import parquet_source

    rows, shared = 50, b"\0" * (2 << 20)
    meta = {"info": {"features": {"image": {"_type": "Image"}, **SHARED_META["info"]["features"]}}}
    image = {"bytes": jpeg(), "path": "a.JPEG", "nest": {"v": shared}}
    table = pa.table({"image": [image] * rows, "image.nest": [shared] * rows, "label": [0] * rows})
    path = str(tmp_path / "train-00000-of-00001.parquet")
    write = {"dictionary_pagesize_limit": 1 << 30, "compression": "zstd"}
    pq.write_table(table.replace_schema_metadata({"huggingface": json.dumps(meta)}), path, **write)
    del table
    reader = parquet_source.Reader(path)
    assert reader.columns.read == [0, 1, 4]  # image.bytes, image.path, label: not image.nest.v (2), image.nest (3)
    held, before, pool = [], resident(), pa.total_allocated_bytes()  # the pool: what earlier tests left there too
    for _, image in parquet_source.shard_images([parquet_source.Piece(path, 0, 0, rows, 0)], OPTS):
        held.append(pa.total_allocated_bytes() - pool)
        assert not isinstance(image, BadImage) and image.data == jpeg()
    assert len(held) == rows and max(held) < 4 << 20, f"{max(held):,} bytes held by Arrow"
    assert resident() - before < 50 << 20


def test_a_path_longer_than_a_file_name_names_the_row_instead(tmp_path):
    """A row's ``path`` whose last part is longer than any file name (`NAME_MAX`) is not copied into every record
    and message: the row is named by its row group and row, as one without a path."""
    from data_tools import parquet_source

    long = "a" * (parquet_source.NAME_MAX + 1) + ".JPEG"
    src = hub_file(tmp_path, image=([{"bytes": jpeg(), "path": long}], datasets.Image()), label=LABEL)
    files = parquet_source.parquet_files(src)
    ((item, _),) = parquet_source.shard_images([parquet_source.Piece(files[0], 0, 0, 1, 0)], OPTS)
    assert item.path == os.path.join(files[0], "group0-row0")


def test_a_footer_counting_more_rows_than_its_pages_hold_is_one_line(tmp_path):
    """Rows the footer counts but no page holds: named as a damaged file when the labels are checked (before, each
    shard that drew them said its images were unreadable)."""
    from tests.helpers import parquet_footer

    src = hub_file(tmp_path, image=IMAGE, label=LABEL)
    path = os.path.join(src, "data", "train-00000-of-00001.parquet")
    body, footer = parquet_footer.read(path)
    group = footer[parquet_footer.ROW_GROUPS][1][1][0]
    group[parquet_footer.GROUP_ROWS] = (group[parquet_footer.GROUP_ROWS][0], 5)
    footer[parquet_footer.FILE_ROWS] = (footer[parquet_footer.FILE_ROWS][0], 5)
    parquet_footer.write(path, body, footer)
    done = call_main(CONVERT, "--src", src, "--out", str(tmp_path / "out"), "--workers", "0", "--no-progress")
    assert done.returncode == 2 and done.stderr.strip() == (
        f"error: {path}: not a readable parquet file (row group 0 holds 1 labels, its footer says 5 rows); download "
        "it again or remove it"
    )


def test_datasets_row_groups_are_read_plain_and_the_other_read_gives_the_same_records(
    hub_set, from_parquet, tmp_path, monkeypatch
):
    """``datasets`` writes image bytes uncompressed and plain: every row group of its files is read plain (no
    dictionary to build, docs/PERFORMANCE.md section 2). Past `PLAIN_CHUNK_MAX` a row group is read
    dictionary-encoded instead, and the records are the same, byte for byte; so they are read plain in batches
    of fewer rows (`PLAIN_BATCH_BYTES`)."""
    from data_tools import parquet_source

    for path in parquet_source.parquet_files(hub_set):
        reader = parquet_source.Reader(path)
        meta = reader.plain.metadata
        assert all(
            parquet_source.plain_bytes(meta.row_group(g), reader.columns.image_leaves)
            for g in range(meta.num_row_groups)
        )
    for name, value in (("PLAIN_CHUNK_MAX", 1), ("PLAIN_BATCH_BYTES", 1)):
        with monkeypatch.context() as m:
            m.setattr(parquet_source, name, value)
            out = str(tmp_path / name)
            done = call_main(
                CONVERT, "--src", hub_set, "--out", out, "--workers", "0", "--no-progress", "--train-shards", "3"
            )
            assert done.returncode == 0, done.stderr
            for split in ("train", "validation"):
                assert records(out, split) == records(from_parquet, split)


def resident() -> int:
    """This process's resident bytes now (not its peak: the peak may be an earlier test's)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_row_with_a_path_and_no_bytes_says_paths_are_never_read(tmp_path):
    src = hub_file(
        tmp_path, image=([{"bytes": None, "path": "/etc/passwd"}], datasets.Image(decode=False)), label=LABEL
    )
    done = call_main(CONVERT, "--src", src, "--out", str(tmp_path / "out"), "--workers", "0", "--no-progress")
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "train-00000-of-00001.parquet/group0-row0: " in lines[0] and "passwd" not in lines[0], lines[0]
    assert "no image bytes (a path-only image: vitlarge never reads paths from a parquet file)" in lines[0]
