"""Bad input: one line naming the file and the fix, exit 2 / UserError, nothing partial under a final name."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid

import pytest
import torch

from data_tools import imagenet_to_tfrecord, make_index, tfrecord_io
from tests.helpers import call_main, mounts
from tests.helpers.data_fixtures import SYNSETS, copy_imagefolder, corrupt_jpeg_bytes
from tests.helpers.loaders import open_train, open_val
from vitlarge.data import load_manifest
from vitlarge.errors import UserError
from vitlarge.fileio import write_atomic

CPU = torch.device("cpu")


def convert_main(src, out, *extra) -> int:
    return imagenet_to_tfrecord.main(
        [
            "--src",
            str(src),
            "--out",
            str(out),
            "--train-shards",
            "3",
            "--val-shards",
            "1",
            "--workers",
            "0",
            "--no-progress",
            *extra,
        ]
    )


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: "), err
    return err[-1]


def final_names(out) -> set[str]:
    """Shard and index files under their final names (no .tmp)."""
    return {n for n in os.listdir(out) if n.startswith(("train-", "validation-")) and not n.endswith(".tmp")}


@pytest.fixture
def data_copy(tiny_converted, tmp_path) -> str:
    dst = str(tmp_path / "data")
    shutil.copytree(tiny_converted, dst)
    return dst


def train_loader(data_dir):
    return open_train(data_dir, 4, 32, rank=0, world_size=1, device=CPU, seed=0)


# --- conversion ---------------------------------------------------------------------------------


def test_missing_source_cli(tmp_path):
    r = call_main("data_tools.imagenet_to_tfrecord", "--src", str(tmp_path / "nope"), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"error: {tmp_path / 'nope'}: source directory does not exist; pass --src ROOT with ROOT/train/<class>/*"
    )
    assert "Traceback" not in r.stderr


def test_empty_class_directory(tiny_imagefolder, tmp_path, capsys):
    src = copy_imagefolder(tiny_imagefolder, str(tmp_path / "src"))
    os.makedirs(os.path.join(src, "train", "n09999999"))
    assert convert_main(src, tmp_path / "out") == 2
    empty = os.path.join(src, "train", "n09999999")
    assert error_line(capsys) == f"error: {empty}: empty class directory; add images or remove it"


def test_validation_class_not_in_train(tiny_imagefolder, tmp_path, capsys):
    src = copy_imagefolder(tiny_imagefolder, str(tmp_path / "src"))
    os.rename(os.path.join(src, "val", SYNSETS[2]), os.path.join(src, "val", "n09999999"))
    assert convert_main(src, tmp_path / "out") == 2
    line = error_line(capsys)
    assert f"{os.path.join(src, 'val', 'n09999999')}: class 'n09999999' is not in {os.path.join(src, 'train')}" in line


@pytest.fixture
def src_with_corrupt_jpeg(tiny_imagefolder, tmp_path) -> tuple[str, str]:
    src = copy_imagefolder(tiny_imagefolder, str(tmp_path / "src"))
    bad = os.path.join(src, "train", SYNSETS[1], "zz_corrupt.JPEG")
    with open(bad, "wb") as f:
        f.write(corrupt_jpeg_bytes())
    return src, bad


def test_corrupt_jpeg_fails_by_default(src_with_corrupt_jpeg, tmp_path, capsys):
    src, bad = src_with_corrupt_jpeg
    out = tmp_path / "out"
    assert convert_main(src, out) == 2
    line = error_line(capsys)
    assert line.startswith(f"error: {bad}: unreadable image (") and "--skip-bad" in line
    assert not (out / "dataset.json").exists()
    assert len(final_names(out)) < 6  # the shard holding the bad file never got its final name
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_corrupt_jpeg_skipped_and_counted(src_with_corrupt_jpeg, tmp_path, capsys):
    src, bad = src_with_corrupt_jpeg
    out = tmp_path / "out"
    assert convert_main(src, out, "--skip-bad") == 0
    err = capsys.readouterr().err
    assert f"skipped {bad}: " in err and "1 unreadable image skipped" in err
    m = load_manifest(str(out))
    assert m.skipped == {"train": 1, "validation": 0} and m.num_examples("train") == 18
    assert (out / "skipped.txt").read_text().startswith(bad + "\t")


def test_output_under_a_regular_file_is_not_writable(tiny_imagefolder, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert convert_main(tiny_imagefolder, blocker / "out") == 2
    assert error_line(capsys) == (
        f"error: {blocker / 'out'}: output directory is not writable (Not a directory); choose another --out"
    )


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs (root can mount one); skips where mounting is not allowed."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def mount(*opts):
        try:
            mounts.mount_tmpfs(mnt, ",".join(opts))
        except OSError as e:
            pytest.skip(f"cannot mount a tmpfs here: {e}")
        return mnt

    yield mount
    with contextlib.suppress(OSError):  # never mounted where the test skipped
        mounts.unmount(mnt)


def test_read_only_output_directory(tiny_imagefolder, tmpfs, capsys):
    mnt = tmpfs("size=1m", "ro")
    assert convert_main(tiny_imagefolder, mnt / "out") == 2
    assert error_line(capsys) == (
        f"error: {mnt / 'out'}: output directory is not writable (Read-only file system); choose another --out"
    )


def _assert_disk_full_handled(out, capsys, rc):
    assert rc == 2
    line = error_line(capsys)
    assert ": disk full while writing" in line and "rerun: complete shards are kept" in line
    assert line.startswith(f"error: {out}/") and line.split(":")[1].endswith(".tmp")  # names the file
    assert not (out / "dataset.json").exists()
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    assert len(final_names(out)) < 8


def test_disk_full_mid_shard_on_a_small_tmpfs(tiny_imagefolder, tmpfs, capsys):
    mnt = tmpfs("size=48k")
    out = mnt / "out"
    _assert_disk_full_handled(out, capsys, convert_main(tiny_imagefolder, out))


class _SmallDisk:
    """A shard file on a disk with ``limit`` bytes free: a write past them raises ENOSPC and writes nothing."""

    def __init__(self, file, limit: int):
        self.file, self.limit, self.size = file, limit, 0

    def writelines(self, pieces) -> None:
        pieces = list(pieces)
        size = sum(len(p) for p in pieces)
        if self.size + size > self.limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.size += size
        self.file.writelines(pieces)

    def __getattr__(self, name):
        return getattr(self.file, name)


def test_disk_full_mid_shard_injected(tiny_imagefolder, tmp_path, capsys, monkeypatch):
    """The same path without mount privileges: a file-system shim under the shard writer raises ENOSPC
    once a shard grows past 9000 bytes."""

    def small_disk_open(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        return _SmallDisk(f, 9000) if mode == "wb" else f

    monkeypatch.setattr(tfrecord_io, "open", small_disk_open, raising=False)  # the writer's module only
    out = tmp_path / "out"
    _assert_disk_full_handled(out, capsys, convert_main(tiny_imagefolder, out))
    monkeypatch.delattr(tfrecord_io, "open")
    assert convert_main(tiny_imagefolder, out) == 0  # space back: the rerun completes


# --- reading ------------------------------------------------------------------------------------


def test_missing_manifest(tmp_path):
    with pytest.raises(UserError) as e:
        load_manifest(str(tmp_path))
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'dataset.json'}: missing;") and "make_index" in msg and "\n" not in msg


def test_truncated_tfrecord(data_copy, capsys):
    shard = os.path.join(data_copy, "train-00001-of-00003")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 100)
    with pytest.raises(UserError, match=f"^{shard}: truncated TFRecord"):
        train_loader(data_copy)
    os.remove(os.path.join(data_copy, "dataset.json"))
    assert make_index.main([data_copy, "--workers", "1"]) == 2
    assert error_line(capsys).startswith(f"error: {shard}: truncated TFRecord (record at byte ")
    assert not os.path.exists(os.path.join(data_copy, "dataset.json"))


def test_missing_index(data_copy):
    index = os.path.join(data_copy, "validation-00001-of-00002.idx")
    os.remove(index)
    with pytest.raises(UserError) as e:
        open_val(data_copy, 4, 32, rank=0, world_size=1, device=CPU)
    assert str(e.value) == (
        f"{index}: missing DALI index for {index[:-4]}; run python -m data_tools.make_index {data_copy}"
    )


def test_stale_index(data_copy):
    index = os.path.join(data_copy, "train-00002-of-00003.idx")
    shutil.copy(os.path.join(data_copy, "train-00000-of-00003.idx"), index)
    with pytest.raises(UserError) as e:
        train_loader(data_copy)
    assert str(e.value) == (
        f"{index}: stale DALI index (does not match {index[:-4]}); run python -m data_tools.make_index {data_copy}"
    )
    # the advertised fix works (one process here; its worker pool, the default: tests/e2e/test_convert_processes.py)
    assert make_index.main([data_copy, "--workers", "1"]) == 0
    train_loader(data_copy)


def test_shard_replaced_after_manifest(data_copy):
    shard = os.path.join(data_copy, "train-00000-of-00003")
    with open(shard, "ab") as f:
        f.write(tfrecord_io.frame(b"\x00" * 10))
    with pytest.raises(UserError, match=f"^{shard}: shard changed since dataset.json was written.*make_index"):
        train_loader(data_copy)


def test_manifest_built_for_another_shard_set(data_copy):
    """A second set beside the one dataset.json lists (what make_index would merge in) is refused."""
    shutil.copy(os.path.join(data_copy, "train-00000-of-00003"), os.path.join(data_copy, "train-00000-of-00001"))
    with pytest.raises(UserError) as e:
        train_loader(data_copy)
    assert str(e.value) == (
        f"{data_copy}: holds 2 train shard sets, train-*-of-00001 (1 file) and train-*-of-00003 (3 files), but "
        f"dataset.json was built for 3 of them; delete the set you do not use, then run "
        f"python -m data_tools.make_index {data_copy}"
    )


def test_manifest_listing_two_sets_or_a_partial_set(data_copy):
    path = os.path.join(data_copy, "dataset.json")
    doc = json.loads(open(path).read())
    shards = doc["splits"]["validation"]["shards"]
    doc["splits"]["validation"]["shards"] = shards[:1]  # validation-00000-of-00002 alone
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(UserError) as e:
        open_val(data_copy, 4, 32, rank=0, world_size=1, device=CPU)
    assert str(e.value) == (
        f"{path}: the validation shards listed are not one complete set (the validation-*-of-00002 set lacks "
        f"validation-00001-of-00002); restore the missing shards or re-convert, then run "
        f"python -m data_tools.make_index {data_copy}"
    )


@pytest.mark.parametrize("loader", ["train", "val"])
def test_label_outside_class_range(data_copy, loader):
    path = os.path.join(data_copy, "dataset.json")
    doc = json.loads(open(path).read())
    doc["num_classes"] = 2  # the records carry labels 1..3 with offset 1 -> class 2 is out of range
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(UserError) as e:
        if loader == "train":
            for _ in range(10):
                next(train_loader(data_copy))
        else:
            list(open_val(data_copy, 8, 32, rank=0, world_size=1, device=CPU))
    msg = str(e.value)
    assert msg.startswith(f"{data_copy}: stored label 3 in the ") and "maps to class 2, outside 0..1" in msg
    assert "make_index" in msg and "\n" not in msg


def test_make_index_without_shards(tmp_path):
    r = call_main("data_tools.make_index", str(tmp_path))
    assert r.returncode == 2 and r.stderr.startswith(f"error: {tmp_path}: no shards named train-NNNNN-of-NNNNN")


def test_no_partial_manifest_name_ever(tmp_path):
    """write_atomic (the converter's, from vitlarge.fileio) leaves nothing under the final name when the write fails."""
    target = tmp_path / f"x-{uuid.uuid4().hex}"
    with pytest.raises(TypeError):
        write_atomic(str(target), None)  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


def test_undecodable_image_inside_a_shard(tmp_path):
    """Shards made elsewhere may hold a broken JPEG: one line naming the data and the fix, not a DALI dump."""
    with tfrecord_io.ShardWriter(str(tmp_path / "train-00000-of-00001")) as w:
        for i in range(12):
            w.write(
                tfrecord_io.encode_example(
                    {
                        "image/encoded": (corrupt_jpeg_bytes() + b"garbage" if i == 5 else _tiny_jpeg(), "byte"),
                        "image/class/label": (1, "int"),
                    }
                )
            )
        w.commit()
    make_index.make_index(str(tmp_path))
    loader = open_train(str(tmp_path), 4, 32, rank=0, world_size=1, device=CPU, seed=0, initial_fill=16)
    with pytest.raises(UserError) as e:
        for _ in range(6):
            next(loader)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path}: an image in the train shards cannot be decoded (") and "\n" not in msg
    assert msg.endswith(
        "re-convert the source with python -m data_tools.imagenet_to_tfrecord --check decode --skip-bad"
    )


def test_undecodable_image_read_in_place_names_the_fix_for_its_tars(tmp_path):
    """A WebDataset image that passes make_index's header check but does not decode (cut short, an end marker
    appended): the loader's line names the tar set's fix, not the converter, which reads no tars."""
    from tests.helpers.wds_sets import write_timm_wds

    bad = corrupt_jpeg_bytes() + b"\xff\xd9"
    d = write_timm_wds(
        str(tmp_path / "wds"), {"train": 3, "validation": 2}, edit=lambda s, i, x: {**x, "jpg": bad} if i == 1 else x
    )
    make_index.make_index(d)
    with pytest.raises(UserError) as e:
        list(open_val(d, 2, 16, device=CPU))
    msg = str(e.value)
    assert msg.startswith(f"{d}: an image in the validation shards cannot be decoded (") and "\n" not in msg
    assert "imagenet_to_tfrecord" not in msg and msg.endswith(
        f"re-write or re-download the tar that holds it, then rerun python -m data_tools.make_index {d}"
    ), msg


def _tiny_jpeg() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(buf, "JPEG")
    return buf.getvalue()


def test_a_file_pil_cannot_identify_is_named_by_its_path_not_a_buffer(tiny_imagefolder, tmp_path, capsys):
    """Before: skipped.txt's reason was PIL's 'cannot identify image file <_io.BytesIO object at 0x...>'."""
    from tests.helpers.data_fixtures import copy_imagefolder

    src = copy_imagefolder(tiny_imagefolder, str(tmp_path / "src"))
    bad = os.path.join(src, "train", os.listdir(os.path.join(src, "train"))[0], "zz_text.JPEG")
    with open(bad, "wb") as f:
        f.write(b"this is not an image at all" * 10)
    out = tmp_path / "out"
    assert convert_main(src, out, "--skip-bad") == 0
    reason = (out / "skipped.txt").read_text().split("\t", 1)[1]
    assert "cannot identify image file" in reason and "BytesIO" not in reason and "0x" not in reason


@pytest.mark.parametrize(
    "split, count, shards",
    [
        ("train", 350, 1),
        ("train", 1_281_167, 1024),
        ("train", 12_520, 10),
        ("validation", 50_000, 128),
        ("validation", 360, 1),
        ("train", 10**8, 1024),
    ],
)
def test_default_shard_counts_keep_imagenets_shard_size(split, count, shards):
    """Before: --train-shards defaulted to 1024, so a 350-image set became 350 one-image shards."""
    from data_tools.imagenet_to_tfrecord import default_shards

    assert default_shards(split, count) == shards
