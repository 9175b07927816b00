"""make_index on WebDataset folders in timm's layout: sets written by the webdataset library, read back by timm."""

from __future__ import annotations

import json
import os
import shutil
import tarfile

import pytest

from data_tools import make_index
from tests.helpers.data_fixtures import bomb_jpeg, jpeg
from tests.helpers.wds_sets import CLASSES, member_tar, write_timm_wds
from vitlarge.data.manifest import MANIFEST_NAME, load_manifest, reindex_fix, shard_files, split_sizes
from vitlarge.data.manifest_schema import WDS_FORMAT
from vitlarge.data.wds_shards import IndexedSamples
from vitlarge.errors import UserError


def index(d: str, *args: str) -> None:
    make_index.make_index(d, workers=1, **dict(a.split("=") for a in args))  # in-process: no pool


@pytest.fixture(scope="module")
def timm_set(tmp_path_factory) -> str:
    d = write_timm_wds(str(tmp_path_factory.mktemp("wds") / "tiny"))
    index(d)
    return d


def test_make_index_reads_timms_layout_in_place(timm_set):
    m = load_manifest(timm_set)
    assert m.format == WDS_FORMAT and m.label_offset == 0 and m.num_classes == 3
    assert [s.file for s in m.splits["train"]] == [f"tiny-train-{i:04d}.tar" for i in range(3)]
    assert (m.num_examples("train"), m.num_examples("validation")) == (20, 11)
    assert [c.synset for c in m.classes] == list(CLASSES)  # timm's class_name, for the export's label_names
    sizes = split_sizes(m, "validation")  # from the JPEG headers, for data.rect_val
    assert sizes is not None and [tuple(x) for x in sizes[:3]] == [(16, 16), (20, 20), (24, 24)]
    samples = IndexedSamples(shard_files(m, "validation"))
    assert [samples.read(i)[1] for i in range(11)] == [i % 3 for i in range(11)]
    assert samples.read(4)[0][:2] == b"\xff\xd8"


def test_timms_own_reader_reads_the_same_set(timm_set):
    """The layout is timm's: its wds/ reader (webdataset underneath) yields the same labels, in order."""
    from timm.data import create_dataset

    ds = create_dataset("wds/tiny", root=timm_set, split="validation", is_training=False, batch_size=1)
    labels = [int(target) for _, target in ds]
    assert labels == [i % 3 for i in range(11)]


def write_edited(tmp_path, edit=None, per_tar=7) -> str:
    return write_timm_wds(str(tmp_path / "set"), {"train": 9, "validation": 4}, per_tar=per_tar, edit=edit)


def refused(d: str, capsys, *args: str) -> str:
    """make_index's command line on ``d``: exit status 2, one line naming a file of ``d``; no dataset.json."""
    rc = make_index.main([d, "--workers", "1", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and d in err[0], err
    assert not os.path.exists(os.path.join(d, MANIFEST_NAME))
    return err[0]


def drop(ext):
    def edit(split, i, sample):
        if split == "train" and i == 3:
            sample.pop(ext)
        return sample

    return edit


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (drop("cls"), "has no .cls"),
        (drop("jpg"), "has no image"),
        (lambda s, i, x: {**x, "cls": "7"} if i == 2 else x, "label 7, outside the 3 classes"),
        (lambda s, i, x: {**x, "cls": "two"} if i == 2 else x, "not a class index"),
        (lambda s, i, x: {**x, "jpg": b"GIF89a not really"} if i == 5 else x, "not an image DALI decodes"),
        (lambda s, i, x: {**x, "jpg": b"<html>a download error page</html>"} if i == 5 else x, "not an image"),
    ],
)
def test_a_bad_sample_is_one_line_naming_its_tar(tmp_path, capsys, edit, words):
    d = write_edited(tmp_path, edit)
    args = ("--num-classes", "3") if "outside" in words else ()
    line = refused(d, capsys, *args)
    assert words in line and "tiny-train-0000.tar" in line, line


def test_info_counts_that_disagree_with_the_tars_are_refused(tmp_path, capsys):
    d = write_edited(tmp_path)
    info = json.load(open(os.path.join(d, "_info.json")))
    info["splits"]["train"]["shard_lengths"][1] += 1
    json.dump(info, open(os.path.join(d, "_info.json"), "w"))
    assert "states 3 samples for tiny-train-0001.tar, which holds 2" in refused(d, capsys)
    info["splits"]["train"]["shard_lengths"][1] -= 1
    info["splits"]["train"]["num_samples"] = 10
    json.dump(info, open(os.path.join(d, "_info.json"), "w"))
    assert "states 10 train samples, the tars hold 9" in refused(d, capsys)


def test_a_missing_tar_is_refused_before_any_is_read(tmp_path, capsys):
    d = write_edited(tmp_path)
    os.remove(os.path.join(d, "tiny-train-0001.tar"))
    assert "names tiny-train-0001.tar" in refused(d, capsys)
    assert not any(n.endswith(".idx") for n in os.listdir(d))


@pytest.mark.parametrize("cut", ["mid-member", "at-a-member"])
def test_a_truncated_tar_is_refused(tmp_path, capsys, cut):
    d = write_edited(tmp_path)
    path = os.path.join(d, "tiny-train-0001.tar")
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    with open(path, "r+b") as f:  # into the last member's bytes, or just before its header (no end blocks)
        f.truncate(last.offset_data + 10 if cut == "mid-member" else last.offset)
    line = refused(d, capsys)
    assert "tiny-train-0001.tar" in line and ("truncated" in line or "not a readable tar" in line), line


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "device", "absolute", "dotdot"])
def test_a_member_that_is_a_link_a_device_or_leads_out_is_refused(tmp_path, capsys, kind):
    d = write_edited(tmp_path, per_tar=9)
    os.remove(os.path.join(d, "_info.json"))  # the tars by name: *-train-N.tar
    member_tar(os.path.join(d, "tiny-train-0000.tar"), kind)
    line = refused(d, capsys)
    assert "tiny-train-0000.tar" in line
    assert {"symlink": "is a link", "hardlink": "is a link", "device": "device"}.get(kind, "leads out") in line


def test_a_loader_refuses_a_tar_changed_after_indexing(timm_set, tmp_path):
    d = str(tmp_path / "copy")
    shutil.copytree(timm_set, d)
    with open(os.path.join(d, "tiny-validation-0001.tar"), "r+b") as f:
        f.truncate(1024)
    with pytest.raises(UserError, match=r"tiny-validation-0001.tar: truncated tar"):
        shard_files(load_manifest(d), "validation")
    os.remove(os.path.join(d, "tiny-train-0000.idx"))
    with pytest.raises(UserError, match=r"tiny-train-0000.idx: missing DALI index"):
        shard_files(load_manifest(d), "train")


def test_out_indexes_a_read_only_webdataset_folder_and_the_loaders_read_the_tars_there(tmp_path):
    from tests.helpers.loaders import open_val
    from tests.helpers.mounts import read_only, snapshot

    d, out = write_edited(tmp_path), tmp_path / "index"
    before = snapshot(d)
    with read_only(d):
        m = make_index.make_index(d, out=str(out), workers=1)
        assert snapshot(d) == before
        assert json.loads((out / MANIFEST_NAME).read_text())["data_dir"] == d
        assert sorted(os.listdir(out)) == [
            MANIFEST_NAME,
            "tiny-train-0000.idx",
            "tiny-train-0001.idx",
            "tiny-validation-0000.idx",
            "tiny-validation-0000.tar.sizes",
        ]
        assert [os.path.dirname(t) for t, _ in shard_files(m, "train")] == [d, d]
        assert reindex_fix(m).endswith(f"make_index {d} --out {out}")  # what the loaders' messages say to run
        for rect in (False, True):
            v = open_val(str(out), 3, 32, rect_val=rect, patch_size=16)
            assert [x for _, labels in v for x in labels.tolist()] == [0, 1, 2, 0]
            del v  # its tars closed before the mount goes
        assert snapshot(d) == before


def test_a_webdataset_folder_not_yet_indexed_names_make_index(tmp_path):
    d = write_edited(tmp_path)
    with pytest.raises(UserError, match=r"a WebDataset folder .* run python -m data_tools.make_index"):
        load_manifest(d)


def edit_info(d: str, change) -> None:
    path = os.path.join(d, "_info.json")
    info = json.load(open(path))
    change(info)
    json.dump(info, open(path, "w"))


@pytest.mark.parametrize("where", ["one split", "two splits"])
def test_a_tar_listed_twice_in_info_json_is_refused_before_any_is_read(tmp_path, capsys, where):
    d = write_edited(tmp_path)

    def twice(info):
        names = info["splits"]["train" if where == "one split" else "validation"]["filenames"]
        names.append("tiny-train-0000.tar")

    edit_info(d, twice)
    line = refused(d, capsys)
    assert "_info.json" in line and "tiny-train-0000.tar" in line and "twice" in line, line
    assert not any(n.endswith(".idx") for n in os.listdir(d))


def test_a_label_past_the_class_cap_is_refused_naming_its_sample(tmp_path, capsys):
    d = write_edited(tmp_path, lambda s, i, x: {**x, "cls": "20000000"} if s == "train" and i == 2 else x)
    line = refused(d, capsys)
    assert "tiny-train-0000.tar" in line and "20000000" in line and "wrote" not in line, line


@pytest.mark.parametrize(
    ("classes", "words"),
    [(["tench", None, "great white shark"], "classes[1]"), (["tench", "tench", "great white shark"], "classes[1]")],
)
def test_info_json_classes_not_distinct_strings_are_refused(tmp_path, capsys, classes, words):
    d = write_edited(tmp_path)
    edit_info(d, lambda info: info.update(classes=classes))
    line = refused(d, capsys)
    assert "_info.json" in line and words in line, line


def test_json_class_names_that_disagree_for_one_label_are_refused(tmp_path, capsys):
    def edit(split, i, sample):
        return {**sample, "json": {**sample["json"], "class_name": "WRONG"}} if split == "validation" else sample

    line = refused(write_edited(tmp_path, edit), capsys)
    assert "WRONG" in line and "tiny-validation-0000.tar" in line, line


def member_of(path: str, info: tarfile.TarInfo, data: bytes, **kw) -> None:
    """Tar ``path``: one good sample ``a``, then member ``info`` with ``data``."""
    import io

    from tests.helpers.wds_sets import jpeg

    with tarfile.open(path, "w", **kw) as tar:
        for name, body in (("a.jpg", jpeg(16, 16, 9)), ("a.cls", b"0")):
            good = tarfile.TarInfo(name)
            good.size = len(body)
            tar.addfile(good, io.BytesIO(body))
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def one_tar_set(tmp_path) -> tuple[str, str]:
    d = tmp_path / "set"
    d.mkdir()
    return str(d), str(d / "x-train-0.tar")


def test_a_sparse_member_is_refused(tmp_path, capsys):
    d, tar = one_tar_set(tmp_path)
    info = tarfile.TarInfo("b.jpg")
    info.type = tarfile.GNUTYPE_SPARSE
    member_of(tar, info, b"", format=tarfile.GNU_FORMAT)
    assert "sparse" in refused(d, capsys).partition(tar)[2]


def test_a_huge_pax_header_is_refused_before_it_is_read(tmp_path, capsys):
    d, tar = one_tar_set(tmp_path)
    info = tarfile.TarInfo("b.cls")
    info.pax_headers = {"comment": "x" * (1 << 20)}
    member_of(tar, info, b"1", format=tarfile.PAX_FORMAT)
    assert "header" in refused(d, capsys).partition(tar)[2]


def test_a_member_name_not_utf8_is_refused(tmp_path, capsys):
    d, tar = one_tar_set(tmp_path)
    member_of(tar, tarfile.TarInfo("k\udcff.cls"), b"1", format=tarfile.GNU_FORMAT, errors="surrogateescape")
    assert "UTF-8" in refused(d, capsys).partition(tar)[2]


def test_an_index_folder_whose_make_index_out_did_not_finish_names_the_command(tmp_path):
    (tmp_path / "tiny-train-0000.idx").write_text("v1.2 1\n")  # indexes written, dataset.json not yet
    with pytest.raises(UserError, match=r"did not finish; rerun .*make_index <data folder> --out " + str(tmp_path)):
        load_manifest(str(tmp_path))


@pytest.mark.parametrize("control", ["\nrm -rf ~", "\u202egnp.", "\x9b2J"])  # a newline, a bidi override, C1's CSI
def test_a_data_dir_with_a_control_character_is_refused(timm_set, tmp_path, control):
    """Refused with the converter's rule for names (`CONTROL_RE`): before, only C0 controls and DEL were."""
    out = tmp_path / "index"
    make_index.make_index(timm_set, out=str(out), workers=1)
    doc = json.loads((out / MANIFEST_NAME).read_text())
    (out / MANIFEST_NAME).write_text(json.dumps({**doc, "data_dir": timm_set + control}))
    with pytest.raises(UserError, match=r"data_dir is .*control character"):
        load_manifest(str(out))


@pytest.mark.parametrize("cut", ["a line missing", "a member past the tar", "no image"])
def test_a_stale_index_with_its_header_intact_is_refused_before_dali_reads_it(timm_set, tmp_path, cut):
    d = str(tmp_path / "copy")
    shutil.copytree(timm_set, d)
    path = os.path.join(d, "tiny-validation-0000.idx")
    lines = open(path).read().splitlines()
    if cut == "a line missing":
        lines.pop()
    else:
        parts = lines[2].split()
        parts[6 if cut == "a member past the tar" else 4] = "99999999" if cut == "a member past the tar" else "txt"
        lines[2] = " ".join(parts)
    open(path, "w").write("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"tiny-validation-0000.idx: stale DALI index .* run .*make_index"):
        shard_files(load_manifest(d), "validation")


def test_an_index_folder_whose_tars_are_not_mounted_says_so_not_that_a_tar_is_missing(timm_set, tmp_path):
    """A read-only set indexed with --out, its mount gone: the loaders' check names the data folder as not there
    (mount it), as for TFRecords, rather than the first tar as missing (restore it)."""
    d, out = str(tmp_path / "mnt" / "wds"), tmp_path / "index"
    shutil.copytree(timm_set, d)
    m = make_index.make_index(d, out=str(out), workers=1)
    shutil.rmtree(tmp_path / "mnt")
    for split in ("train", "validation"):
        with pytest.raises(UserError) as e:
            shard_files(m, split)
        assert str(e.value).startswith(f"{out / MANIFEST_NAME}: its data_dir {d} is not a folder here; mount ")


@pytest.mark.parametrize("edited,tar", [(3, "tiny-train-0000.tar"), (9, "tiny-train-0001.tar")])  # its tar, another
def test_a_json_naming_a_label_unlike_another_sample_is_one_line_naming_the_tar(tmp_path, capsys, edited, tar):
    """Sample ``edited`` (label 0, as sample 0) names another class in its .json: refused whether the samples share
    a tar (read before: only a tar's first .json of a label was) or not; nothing written."""

    def edit(split, i, sample):
        return (
            {**sample, "json": {**sample["json"], "class_name": "other"}} if (split, i) == ("train", edited) else sample
        )

    d = write_timm_wds(str(tmp_path / "set"), {"train": 12, "validation": 3}, edit=edit)
    assert make_index.main([d, "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {os.path.join(d, tar)}: ") and "label 0" in err
    assert not os.path.exists(os.path.join(d, MANIFEST_NAME))


def test_a_padded_index_in_an_index_folder_names_make_index_with_out(timm_set, tmp_path):
    """Rectangular validation reads a read-only set's samples by the index in its index folder: a stale or padded
    index there is refused with the make_index line that writes it again, ``--out`` and all (without ``--out`` it
    would write into the read-only data folder)."""
    out = tmp_path / "index"
    m = make_index.make_index(timm_set, out=str(out), workers=1)
    (tar, index), *_ = shard_files(m, "validation")
    with open(index, "ab") as f:
        f.write(b"x" * (1 << 20))
    with pytest.raises(UserError, match="stale or padded DALI index") as e:
        IndexedSamples([(tar, index)])
    assert str(e.value).endswith(f"make_index {timm_set} --out {out}")


def test_a_folder_whose_path_has_a_control_character_is_refused_before_any_index_is_written(tmp_path, capsys):
    d = write_timm_wds(str(tmp_path / "a\nb"), {"train": 3, "validation": 3})
    rc = make_index.main([d, "--workers", "1"])
    assert rc == 2 and "control character" in capsys.readouterr().err
    assert sorted(os.listdir(d)) == ["_info.json", "tiny-train-0000.tar", "tiny-validation-0000.tar"]


def test_an_image_past_the_converters_pixel_guard_is_refused_naming_it(tmp_path, capsys):
    """A JPEG whose header says 60,000 x 60,000 (a decompression bomb: 10.8 GB once DALI decodes it) is refused as
    the converter refuses it (--max-image-pixels, the same default), not indexed for the loader to decode; the option
    raises the guard for trusted images."""
    d = write_edited(tmp_path, lambda s, i, x: {**x, "jpg": bomb_jpeg()} if s == "validation" and i == 1 else x)
    line = refused(d, capsys)
    assert (
        "validation_000001.jpg: 60000 x 60000 = 3,600,000,000 pixels, more than --max-image-pixels 89,478,485" in line
    )
    assert make_index.main([d, "--workers", "1", "--max-image-pixels", "3600000000"]) == 0


def test_an_image_past_the_converters_byte_guard_is_refused_before_it_is_read(tmp_path, capsys):
    """An image member of more than 4 bytes a pixel of --max-image-pixels is refused from its size, as the converter
    refuses such a file unread, where one without its end marker was read whole (up to 1 GiB) to decode."""
    small = jpeg(8, 8)  # 64 pixels, 634 bytes: within 200 pixels and 800 bytes
    d = write_edited(
        tmp_path, lambda s, i, x: {**x, "jpg": small + b"\0" * 400 if s == "validation" and i == 1 else small}
    )
    line = refused(d, capsys, "--max-image-pixels", "200")
    assert f"validation_000001.jpg: {len(small) + 400:,} bytes, more than 4 a pixel of --max-image-pixels 200" in line
    assert make_index.main([d, "--workers", "1", "--max-image-pixels", "300"]) == 0  # 1,034 bytes within 1,200


@pytest.mark.parametrize("kind", ["cut", "trailing"])
def test_a_truncated_jpeg_is_refused_as_the_converter_refuses_it(tmp_path, capsys, kind):
    """A JPEG cut short (a download that stopped) is refused naming it, as the converter's header check refuses it
    (no end marker: decoded, and the decode fails), not indexed for the loader to stop on in training; one with bytes
    after its end marker decodes and is kept, as the converter keeps it."""
    whole = jpeg(48, 40)
    image = whole[: len(whole) // 2] if kind == "cut" else whole + b"\0" * 7
    d = write_edited(tmp_path, lambda s, i, x: {**x, "jpg": image} if s == "validation" and i == 1 else x)
    if kind == "trailing":
        index(d)
        return
    line = refused(d, capsys)
    assert "validation_000001.jpg: a truncated or damaged image" in line and "re-write the sample" in line, line
