"""`data_tools.make_index` on shards made elsewhere: ``--out`` (an index folder for a data folder it may not
write: nothing is written there, the loaders read the shards where they are) and TFDS's layout
(``<name>-<split>.tfrecord-NNNNN-of-NNNNN`` beside ``dataset_info.json``, features ``image``/``label``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat

import pytest
import torch

from data_tools import make_index
from tests.helpers import call_main, mounts
from tests.helpers.loaders import open_val
from vitlarge.data.manifest import load_manifest, shard_files, validate_data_dir
from vitlarge.errors import UserError


def snapshot(root) -> dict:
    """Every entry under ``root``: its kind, size and modification time (what a write would change)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (
                stat.S_IFMT(st.st_mode),
                st.st_size,
                st.st_mtime_ns,
            )
    return out


@contextlib.contextmanager
def read_only(folder):
    """``folder`` made read-only for the block: ``chmod -R a-w``, and where that does not stop this process (root),
    a read-only bind mount of it; skips where neither can be had."""
    modes = {
        p: os.stat(p).st_mode
        for p in [str(folder)] + [os.path.join(d, n) for d, ds, fs in os.walk(folder) for n in ds + fs]
    }
    for p, mode in modes.items():
        os.chmod(p, mode & ~0o222)
    mounted = False
    try:
        if os.access(folder, os.W_OK):
            try:
                mounts.bind_read_only(folder)
            except OSError as e:
                pytest.skip(f"cannot make {folder} read-only here ({e})")
            mounted = True
        yield
    finally:
        if mounted:
            try:
                mounts.unmount(folder)
            except OSError:  # a file still open (a failed assertion's loader): detached, gone when it closes
                mounts.unmount(folder, lazy=True)
        for p, mode in modes.items():
            os.chmod(p, mode)


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
        v = open_val(str(index), 4, 32)
        labels = torch.cat([lab for _, lab in v])
        assert len(labels) == m.num_examples("validation")
        del v  # its shards closed before the mount goes
        assert snapshot(foreign) == before


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
