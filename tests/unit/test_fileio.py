"""vitlarge.fileio against planted names: links where a temporary file, a log or a probe goes, FIFOs and
devices where a file is read, files over a cap. A planted link's target outside must stay untouched."""

from __future__ import annotations

import os
import stat

import pytest

from vitlarge import fileio
from vitlarge.fileio import UnsafeFile


def assert_untouched(victim):
    assert victim.read_bytes() == b"precious"


def test_write_atomic_removes_a_link_planted_as_its_tmp(tmp_path, victim):
    folder = tmp_path / "work"
    folder.mkdir()
    os.symlink(victim, folder / "meta.json.tmp")
    fileio.write_atomic(folder / "meta.json", "new")
    assert_untouched(victim)
    assert (folder / "meta.json").read_text() == "new" and not os.path.lexists(folder / "meta.json.tmp")


def test_write_atomic_replaces_a_link_at_the_final_name(tmp_path, victim):
    folder = tmp_path / "work"
    folder.mkdir()
    os.symlink(victim, folder / "meta.json")
    fileio.write_atomic(folder / "meta.json", "new")
    assert_untouched(victim)
    assert not (folder / "meta.json").is_symlink() and (folder / "meta.json").read_text() == "new"


def test_write_atomic_rename_false_leaves_a_regular_tmp_not_a_link(tmp_path, victim):
    os.symlink(victim, tmp_path / "x.idx.tmp")
    fileio.write_atomic(tmp_path / "x.idx", "0 20\n", rename=False)
    assert_untouched(victim)
    assert stat.S_ISREG(os.lstat(tmp_path / "x.idx.tmp").st_mode)


def test_write_atomic_refuses_a_folder_that_leads_outside_its_root(tmp_path, victim):
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(victim.parent, work / "checkpoints")  # a handed-over workdir's planted folder link
    with pytest.raises(UnsafeFile) as e:
        fileio.write_atomic(work / "checkpoints" / "meta.json", "x", root=work)
    assert "leads outside" in e.value.strerror and e.value.filename == str(work / "checkpoints")
    assert sorted(os.listdir(victim.parent)) == ["victim"]
    fileio.write_atomic(work / "meta.json", "x", root=work)  # inside: fine


def test_a_workdir_that_is_itself_a_link_is_the_users_choice(tmp_path):
    real = tmp_path / "scratch" / "run"
    real.mkdir(parents=True)
    os.symlink(real, tmp_path / "run")
    fileio.write_atomic(tmp_path / "run" / "metrics.png", b"png", root=tmp_path / "run")
    assert (real / "metrics.png").read_bytes() == b"png"


def test_probe_writable_never_touches_a_link_target(tmp_path, victim):
    missing = victim.parent / "created_by_probe"
    os.symlink(missing, tmp_path / ".write_test_0")  # dangling: following it would create the file
    os.symlink(victim, tmp_path / ".write_test_1")
    before = os.stat(victim).st_mtime_ns
    fileio.probe_writable(tmp_path, ".write_test_0")
    fileio.probe_writable(tmp_path, ".write_test_1")
    assert not missing.exists() and os.stat(victim).st_mtime_ns == before
    assert_untouched(victim)
    assert not os.path.lexists(tmp_path / ".write_test_0") and not os.path.lexists(tmp_path / ".write_test_1")


def test_open_append_refuses_a_link_and_a_fifo(tmp_path, victim):
    os.symlink(victim, tmp_path / "metrics.jsonl")
    with pytest.raises(UnsafeFile, match="is a symbolic link"):
        fileio.open_append(tmp_path / "metrics.jsonl")
    assert_untouched(victim)
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(UnsafeFile, match="FIFO"):
        fileio.open_append(tmp_path / "fifo.jsonl")  # never blocks: no reader is needed to refuse it
    with fileio.open_append(tmp_path / "plain.jsonl") as f:
        f.write("a\n")
    with fileio.open_append(tmp_path / "plain.jsonl") as f:
        f.write("b\n")
    assert (tmp_path / "plain.jsonl").read_text() == "a\nb\n"


def test_open_regular_refuses_fifos_and_devices_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafeFile, match="FIFO"):
        fileio.open_regular(tmp_path / "fifo")
    with pytest.raises(UnsafeFile, match="device"):
        fileio.open_regular("/dev/zero")
    os.symlink("/dev/zero", tmp_path / "zero")
    with pytest.raises(UnsafeFile, match="symbolic link"):
        fileio.open_regular(tmp_path / "zero", follow=False)


def test_read_capped_reads_cap_plus_one_bytes_of_a_huge_sparse_file(tmp_path):
    big = tmp_path / "meta.json"
    with open(big, "wb") as f:
        f.truncate(8 << 30)  # 8 GB, sparse: reading it whole would exhaust memory
    with pytest.raises(UnsafeFile) as e:
        fileio.read_capped(big, 1 << 20)
    assert e.value.strerror == "is larger than the 1,048,576-byte cap for this file"
    (tmp_path / "small").write_bytes(b"{}")
    assert fileio.read_capped(tmp_path / "small", 2) == b"{}"


def test_is_inside(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    os.symlink(tmp_path / "d" / "sub", tmp_path / "d" / "in")
    os.symlink(tmp_path, tmp_path / "d" / "up")
    assert fileio.is_inside(tmp_path / "d" / "in" / "x", tmp_path / "d")
    assert not fileio.is_inside(tmp_path / "d" / "up" / "x", tmp_path / "d")
    assert not fileio.is_inside(tmp_path / "dd", tmp_path / "d")  # a prefix is not a parent


# --- the workdir probes of vitlarge.checkpoint.store (the checkpoint side is the lead's) ----------------


def test_shared_probe_goes_through_write_atomic(tmp_path, victim):
    from vitlarge.checkpoint import workdir as ckpt_workdir

    os.symlink(victim, tmp_path / (ckpt_workdir.SHARED_PROBE + ".tmp"))
    os.symlink(victim, tmp_path / ckpt_workdir.SHARED_PROBE)
    token = ckpt_workdir.write_shared_probe(tmp_path)
    assert_untouched(victim)
    assert (tmp_path / ckpt_workdir.SHARED_PROBE).read_text() == token


def test_check_writable_never_touches_a_link_target(tmp_path, victim):
    from vitlarge.checkpoint import workdir as ckpt_workdir

    missing = victim.parent / "created_by_probe"
    os.symlink(missing, tmp_path / ".write_test_0")
    ckpt_workdir.check_writable(tmp_path, rank=0)
    assert not missing.exists()
