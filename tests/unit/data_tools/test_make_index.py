"""`data_tools.make_index` on shards made elsewhere: ``--out`` (an index folder for a data folder it may not
write: nothing is written there, the loaders read the shards where they are) and TFDS's layout
(``<name>-<split>.tfrecord-NNNNN-of-NNNNN`` beside ``dataset_info.json``, features ``image``/``label``)."""

from __future__ import annotations

import io
import json
import os
import shutil
import warnings

import pytest
import torch
from PIL import Image

from data_tools import make_index, tfds_layout
from tests.helpers import call_main
from tests.helpers.data_fixtures import big_png, bomb_jpeg, jpeg, small_tfds
from tests.helpers.loaders import open_val
from tests.helpers.mounts import read_only, snapshot
from vitlarge.data.manifest import load_manifest, shard_files, split_sizes, validate_data_dir
from vitlarge.data.repeats import IndexedRecords
from vitlarge.errors import UserError


@pytest.fixture
def foreign(tiny_converted, tmp_path):
    """The tiny converted set as shards alone (TensorFlow's output has no indexes or manifest)."""
    dst = tmp_path / "shards"
    shutil.copytree(tiny_converted, dst, ignore=shutil.ignore_patterns("*.idx", "*.sizes", "dataset.json", ".progress"))
    return dst


def test_out_indexes_a_read_only_folder_and_the_loaders_read_the_shards_there(foreign, tmp_path):
    index = tmp_path / "index"
    before = snapshot(foreign)
    with read_only(foreign):
        m = make_index.make_index(str(foreign), out=str(index), workers=1)
        assert snapshot(foreign) == before
        doc = json.loads((index / "dataset.json").read_text())
        assert (doc["format_version"], doc["data_dir"]) == (3, str(foreign))
        shards = [s.file for sp in m.splits.values() for s in sp]
        sized = [s.file for s in m.splits["validation"] if s.sizes_file]
        assert sorted(os.listdir(index)) == sorted(
            ["dataset.json"] + [f + ".idx" for f in shards] + [f + ".sizes" for f in sized]
        )
        validate_data_dir(str(index))
        assert [os.path.dirname(s) for s, _ in shard_files(m, "train")] == [str(foreign)] * 3
        assert [os.path.dirname(i) for _, i in shard_files(m, "train")] == [str(index)] * 3
        assert snapshot(foreign) == before  # the loaders reading through an index folder: the TFDS test below


def test_without_out_a_read_only_folder_is_one_line_naming_out(foreign):
    with read_only(foreign):
        r = call_main("data_tools.make_index", str(foreign), "--workers", "1")
    assert r.returncode == 2
    assert "--out" in r.stderr and r.stderr.count("\n") == 1


def test_a_shard_of_data_dir_linked_outside_it_is_refused(foreign, tmp_path):
    index = tmp_path / "index"
    make_index.make_index(str(foreign), out=str(index), workers=1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shard = foreign / "train-00001-of-00003"
    shutil.move(shard, elsewhere / shard.name)
    os.symlink(elsewhere / shard.name, shard)
    with pytest.raises(UserError, match=rf"^{shard}: leads outside {foreign} "):
        shard_files(load_manifest(str(index)), "train")


def test_a_data_dir_that_is_not_there_is_one_line(foreign, tmp_path):
    index = tmp_path / "index"
    make_index.make_index(str(foreign), out=str(index), workers=1)
    shutil.rmtree(foreign)
    with pytest.raises(UserError) as e:
        validate_data_dir(str(index))
    assert str(e.value).startswith(f"{index / 'dataset.json'}: its data_dir {foreign} is not a folder here; ")


@pytest.mark.parametrize(
    "value,why",
    [
        ("relative/shards", "expected an absolute path"),
        ("/data/../etc", "expected a normalized path"),
        ("/data//x", "expected a normalized path"),
        (7, "expected an absolute path"),
    ],
)
def test_a_data_dir_not_absolute_and_normalized_is_refused(foreign, tmp_path, value, why):
    index = tmp_path / "index"
    make_index.make_index(str(foreign), out=str(index), workers=1)
    path = index / "dataset.json"
    doc = json.loads(path.read_text())
    doc["data_dir"] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=f"invalid manifest \\(data_dir is .*, {why}"):
        load_manifest(str(index))


def test_data_dir_is_refused_in_a_version_2_manifest(foreign, tmp_path):
    """A version 2 reader would read the shards beside dataset.json: the key comes with version 3."""
    index = tmp_path / "index"
    make_index.make_index(str(foreign), out=str(index), workers=1)
    path = index / "dataset.json"
    doc = json.loads(path.read_text())
    doc["format_version"] = 2
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"invalid manifest \(data_dir is not a manifest key\)"):
        load_manifest(str(index))


def test_a_manifest_without_data_dir_stays_version_1_or_2(foreign):
    make_index.make_index(str(foreign), workers=1)
    doc = json.loads((foreign / "dataset.json").read_text())
    assert doc["format_version"] in (1, 2) and "data_dir" not in doc and "features" not in doc


# --- TFDS's layout, read in place ----------------------------------------------------------------------------


def test_a_tfds_folder_is_indexed_in_place_with_its_counts_classes_and_sizes(tiny_converted, tmp_path):
    """The tiny set in TFDS's layout (the converter's image bytes, labels 0-based), indexed read-only with --out:
    the loaders read the same images and labels as from the converter's shards; the validation sizes come from the
    JPEG headers and equal the ones the converter recorded."""
    src = tmp_path / "tiny" / "1.0.0"
    tfds_layout.tfds_from_tfrecords(tiny_converted, str(src), "tiny")
    index = tmp_path / "index"
    before = snapshot(src)
    with read_only(src):
        m = make_index.make_index(str(src), out=str(index), workers=1)
        assert snapshot(src) == before
        ref = load_manifest(tiny_converted)
        assert (m.features, m.label_offset, m.num_classes) == (("image", "label"), 0, 3)
        assert [c.synset for c in m.classes] == [c.synset for c in ref.classes]
        assert m.num_examples("train") == ref.num_examples("train") == 18
        assert (split_sizes(m, "validation") == split_sizes(ref, "validation")).all()
        assert m.shards("validation")[0].file == "tiny-validation.tfrecord-00000-of-00002"
        got = [torch.cat([lab for _, lab in open_val(d, 4, 32)]) for d in (str(index), tiny_converted)]
        assert torch.equal(got[0], got[1])
        rect = [torch.cat([lab for _, lab in open_val(d, 4, 32, rect_val=True)]) for d in (str(index), tiny_converted)]
        assert torch.equal(rect[0], rect[1])
        assert snapshot(src) == before


def test_rect_val_reads_a_tfds_split_not_in_aspect_order_by_aspect_each_image_once(tmp_path):
    """TFDS's validation split is in its own order: rectangular validation reads it by aspect ratio (the records'
    sizes from their JPEG headers), at any world size each image once."""
    src = small_tfds(tmp_path / "tinynet" / "1.0.0")  # validation: 30 x 30, 30 x 31, 50 x 20 (w x h)
    make_index.make_index(src, out=str(tmp_path / "index"), workers=1)
    m = load_manifest(str(tmp_path / "index"))
    assert m.order == {} and [tuple(x) for x in split_sizes(m, "validation")] == [(30, 30), (31, 30), (20, 50)]
    one = [(tuple(x.shape[2:]), lab.tolist()) for x, lab in open_val(str(tmp_path / "index"), 2, 32, rect_val=True)]
    # by width / height: record 1 (30/31, label 1), record 0 (30/30, label 0), then record 2 (50/20, label 1)
    assert one == [((33, 32), [1, 0]), ((32, 80), [1])]
    ranks = [open_val(str(tmp_path / "index"), 2, 32, rect_val=True, rank=r, world_size=2) for r in range(2)]
    assert sorted(x for v in ranks for _, lab in v for x in lab.tolist()) == [0, 1, 1]


def test_the_cli_says_where_to_train_from(tmp_path):
    src = small_tfds(tmp_path / "tinynet" / "1.0.0")
    r = call_main("data_tools.make_index", src, "--out", str(tmp_path / "index"), "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert r.stderr.rstrip().endswith(f"train with --data {tmp_path / 'index'} (it reads the shards in {src})")


def refused(src, *args) -> str:
    """make_index's one line for ``src`` (exit 2), with nothing written into the index folder."""
    index = os.path.join(os.path.dirname(src), "index")
    r = call_main("data_tools.make_index", src, "--out", index, "--workers", "1", *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(index, "dataset.json"))
    return r.stderr.strip()


def test_a_tfds_folder_missing_a_shard_is_refused_naming_it(tmp_path):
    src = small_tfds(tmp_path / "tinynet" / "1.0.0")
    os.remove(os.path.join(src, "tinynet-train.tfrecord-00001-of-00002"))
    assert refused(src) == (
        f"error: {src}/tinynet-train.tfrecord-00001-of-00002: missing (dataset_info.json lists 2 train shards); "
        "restore it from the copy the folder came from (a partial copy trains on part of the data)"
    )
    assert not os.path.exists(os.path.join(os.path.dirname(src), "index"))


def test_dataset_info_counts_that_disagree_with_the_shards_are_refused(tmp_path):
    src = small_tfds(tmp_path / "tinynet" / "1.0.0")
    info = json.loads(open(os.path.join(src, "dataset_info.json")).read())
    info["splits"][1]["shardLengths"] = ["4"]
    open(os.path.join(src, "dataset_info.json"), "w").write(json.dumps(info))
    assert refused(src).startswith(
        f"error: {src}/tinynet-validation.tfrecord-00000-of-00001: 3 records, but dataset_info.json lists 4 (its "
        "validation shardLengths); "
    )


def test_a_label_outside_the_classes_is_refused_naming_the_shard(tmp_path):
    src = small_tfds(tmp_path / "tinynet" / "1.0.0", val_label=3)
    assert refused(src).startswith(
        f"error: {src}/tinynet-validation.tfrecord-00000-of-00001: a record has label 3, outside the 3 classes "
        "features.json declares (0..2); "
    )


def test_a_payload_that_is_no_image_is_refused_naming_the_shard_and_record(tmp_path):
    src = small_tfds(tmp_path / "tinynet" / "1.0.0", val_image=b"<html>not found</html>")
    line = refused(src)
    assert line.startswith(f"error: {src}/tinynet-validation.tfrecord-00000-of-00001: the record at byte ")
    assert "feature 'image' holds no image (UnidentifiedImageError)" in line


@pytest.mark.parametrize("kind", ["GIF", "TGA"])
def test_an_image_dali_does_not_decode_is_refused_as_a_webdataset_one_is(tmp_path, kind):
    """A GIF (or TGA) PIL reads but DALI does not decode: refused here as WebDataset's reader refuses it, before a
    dataset.json exists (indexed before, the loader stopped on it at the first validation: 'cannot be decoded')."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, kind)
    src = small_tfds(tmp_path / "tinynet" / "1.0.0", val_image=out.getvalue())
    line = refused(src)
    assert line.startswith(f"error: {src}/tinynet-validation.tfrecord-00000-of-00001: the record at byte ")
    assert f"feature 'image' holds a {kind} image, which DALI does not decode in place" in line


def test_an_image_past_the_converters_pixel_guard_is_refused_naming_the_shard(tmp_path):
    """A record whose JPEG header says 60,000 x 60,000 is refused as the converter refuses it (--max-image-pixels),
    not indexed for DALI to decode (10.8 GB); the option raises the guard."""
    src = small_tfds(tmp_path / "tinynet" / "1.0.0", val_image=bomb_jpeg())
    line = refused(src)
    assert line.startswith(f"error: {src}/tinynet-validation.tfrecord-00000-of-00001: the record at byte ")
    assert "60000 x 60000 = 3,600,000,000 pixels, more than --max-image-pixels 89,478,485" in line
    index = os.path.join(os.path.dirname(src), "index")
    accepted = call_main(
        "data_tools.make_index", src, "--out", index, "--workers", "1", "--max-image-pixels", "3600000000"
    )
    assert accepted.returncode == 0, accepted.stderr


@pytest.mark.parametrize("side", [11_000, 15_000])  # past PIL's limit (it warns), past twice it (it raises)
def test_a_png_past_the_pixel_guard_is_one_line_and_the_option_raises_it(tmp_path, side):
    """A PNG header (read by PIL, not by the JPEG frame parse) past --max-image-pixels is refused in the pixel guard's
    line, not as a record that is no tf.train.Example nor with PIL's warning lines; the option raises PIL's guard too
    (it ignored it: a 15,000 x 15,000 PNG was refused at any --max-image-pixels)."""
    src = small_tfds(tmp_path / "tinynet" / "1.0.0", val_image=big_png(side))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        line = refused(src)
        accepted = call_main(
            "data_tools.make_index",
            src,
            "--out",
            str(tmp_path / "index"),
            "--workers",
            "1",
            "--max-image-pixels",
            "400000000",
        )
    assert line.startswith(f"error: {src}/tinynet-validation.tfrecord-00000-of-00001: the record at byte ")
    assert f"{side * side:,} pixels, more than --max-image-pixels 89,478,485" in line, line
    assert "tf.train.Example" not in line
    assert accepted.returncode == 0, accepted.stderr
    assert not [w for w in seen if issubclass(w.category, Image.DecompressionBombWarning)]


def test_a_truncated_jpeg_is_refused_naming_the_shard(tmp_path):
    """A record whose JPEG is cut short is refused as the converter refuses it, not indexed for DALI to stop on in
    training."""
    whole = jpeg(48, 40)
    src = small_tfds(tmp_path / "tinynet" / "1.0.0", val_image=whole[: len(whole) // 2])
    line = refused(src)
    assert line.startswith(f"error: {src}/tinynet-validation.tfrecord-00000-of-00001: the record at byte ")
    assert "feature 'image' holds a truncated or damaged image" in line and "tf.train.Example" not in line


def test_other_feature_names_are_read_with_image_key_and_label_key(tmp_path):
    """A TFRecord set in TF-slim's file names whose records name their features otherwise."""
    from tfrecord.writer import TFRecordWriter

    src = tmp_path / "shards"
    src.mkdir()
    for split, n in (("train", 4), ("validation", 3)):
        w = TFRecordWriter(str(src / f"{split}-00000-of-00001"))
        for i in range(n):
            w.write({"jpg": (jpeg(32, 24 + i), "byte"), "cls": (i % 2, "int")})
        w.close()
    assert "record without 'image/class/label'" in refused(str(src))
    make_index.make_index(str(src), image_key="jpg", label_key="cls", label_offset=0, workers=1)
    m = load_manifest(str(src))
    assert (m.features, m.num_classes, m.label_offset) == (("jpg", "cls"), 2, 0)
    assert [tuple(x) for x in split_sizes(m, "validation")] == [(24, 32), (25, 32), (26, 32)]
    labels = torch.cat([lab for _, lab in open_val(str(src), 2, 32)])
    assert labels.tolist() == [0, 1, 0]
    records = IndexedRecords(shard_files(m, "train"), world_size=1, features=m.features)  # repeats' and rect_val's
    assert [records.read(i)[1] for i in range(4)] == [0, 1, 0, 1] and records.read(0)[0][:2] == b"\xff\xd8"


def test_a_set_written_by_tensorflow_datasets_is_indexed(tmp_path):
    """TFDS's own writer, where TensorFlow and tensorflow-datasets are installed (not in CI: the layout test above
    writes the same files with the tfrecord package)."""
    tfds = pytest.importorskip("tensorflow_datasets")
    import numpy as np

    class Tinynet(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {
                        "image": tfds.features.Image(encoding_format="jpeg"),
                        "label": tfds.features.ClassLabel(names=["n01", "n02", "n03"]),
                        "file_name": tfds.features.Text(),
                    }
                ),
                supervised_keys=("image", "label"),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate(9), "validation": self._generate(6)}

        def _generate(self, n):
            for i in range(n):
                image = np.full((20 + i, 30, 3), 10 * i, dtype=np.uint8)
                yield f"{i}", {"image": image, "label": i % 3, "file_name": f"{i}.JPEG"}

    builder = Tinynet(data_dir=str(tmp_path / "tfds"))
    builder.download_and_prepare()
    m = make_index.make_index(builder.data_dir, out=str(tmp_path / "index"), workers=1)
    assert (m.num_examples("train"), m.num_examples("validation"), m.num_classes) == (9, 6, 3)
    assert [c.synset for c in m.classes] == ["n01", "n02", "n03"]
    assert sorted(torch.cat([lab for _, lab in open_val(str(tmp_path / "index"), 4, 32)]).tolist()) == [
        0,
        0,
        1,
        1,
        2,
        2,
    ]


def test_the_class_names_file_is_read_as_tfds_reads_it(tmp_path):
    """TFDS's ClassLabel reads its names file split on newlines, each name stripped, blank lines dropped."""
    src = small_tfds(tmp_path / "tinynet" / "1.0.0")
    with open(os.path.join(src, "label" + tfds_layout.LABELS_SUFFIX), "w") as f:
        f.write(" n01 \nn02\r\n\nn03\n\n")
    make_index.make_index(src, workers=1)
    assert [c.synset for c in load_manifest(src).classes] == ["n01", "n02", "n03"]


def test_publish_refuses_a_manifest_its_readers_would_refuse_before_writing_it(tmp_path, capsys):
    """The document is checked as load_manifest checks it before it is written: no "wrote" line, no dataset.json."""
    from vitlarge.data.manifest import MANIFEST_NAME, Manifest, ShardInfo
    from vitlarge.data.manifest_schema import WDS_FORMAT

    shard = ShardInfo("x-train-0.tar", "x-train-0.idx", 3, 1024, None, None)
    m = Manifest(
        num_classes=3,
        label_offset=0,
        classes=[],
        splits={"train": [shard, shard]},
        tool="t",
        tool_version="1",
        data_dir=str(tmp_path),
        format=WDS_FORMAT,
    )
    with pytest.raises(
        UserError, match=r"dataset.json: would be an invalid manifest \(splits.train.shards lists x-train-0.tar twice"
    ):
        make_index.publish(m, 2, ("sample", "tar"), ("", ""))
    assert "wrote" not in capsys.readouterr().err and not os.path.exists(tmp_path / MANIFEST_NAME)
