"""The data tools as processes: tests/unit runs them in the pytest process, so these start them.

Moved from tests/unit (issue 32; the test names kept): the converter's worker processes through the CLI,
a kill -9 and a Ctrl-C mid-shard and the rerun that resumes (data_tools/test_convert.py), make_index with its
worker pool (its default; data_tools/test_convert.py), and a decompression bomb under a memory limit
(data/test_files_from_elsewhere.py).
"""

from __future__ import annotations

import os
import re
import resource
import signal
import struct
import subprocess
import sys
import zlib

import pytest

from tests.helpers import ROOT, run_module
from tests.helpers.data_fixtures import SYNSETS, TINY_TRAIN_PER_CLASS, copy_imagefolder
from vitlarge.data.manifest import load_manifest
from vitlarge.text import plural

REPO = str(ROOT)


@pytest.fixture(scope="module")
def converted(tiny_imagefolder, tmp_path_factory) -> str:
    """The in-process conversion the processes' output is compared with (as in tests/unit/data_tools/test_convert.py)."""
    from data_tools import imagenet_to_tfrecord

    out = str(tmp_path_factory.mktemp("converted"))
    imagenet_to_tfrecord.convert(tiny_imagefolder, out, train_shards=3, val_shards=2, workers=0, progress=False)
    return out


def test_parallel_workers_cli(tiny_imagefolder, converted, tmp_path):
    """Real worker processes through the CLI give the same shards as the in-process run."""
    out = tmp_path / "par"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "data_tools.imagenet_to_tfrecord",
            "--src",
            tiny_imagefolder,
            "--out",
            str(out),
            "--train-shards",
            "3",
            "--val-shards",
            "2",
            "--workers",
            "2",
            "--no-progress",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stderr and "train: 18 images in 3 shards" in r.stderr
    for s in load_manifest(converted).shards("train") + load_manifest(converted).shards("validation"):
        assert (out / s.file).read_bytes() == open(os.path.join(converted, s.file), "rb").read()


def test_resume_after_kill_keeps_complete_shards(tiny_imagefolder, converted, tmp_path):
    out = tmp_path / "resumed"
    args = [
        "--src",
        tiny_imagefolder,
        "--out",
        str(out),
        "--train-shards",
        "3",
        "--val-shards",
        "2",
        "--workers",
        "0",
        "--no-progress",
    ]
    cmd = [sys.executable, "-m", "data_tools.imagenet_to_tfrecord", *args]
    killed = [
        sys.executable,
        "-m",
        "tests.helpers.kill_convert",
        "train-00001-of-00003:2",
        *args,
    ]  # tests/helpers/kill_convert.py
    r = subprocess.run(killed, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == -9  # SIGKILL mid-shard, as a kill -9 or an OOM kill would
    names = set(os.listdir(out))
    assert "train-00000-of-00003" in names and "train-00001-of-00003.tmp" in names
    assert "train-00001-of-00003" not in names and "train-00001-of-00003.idx" not in names
    assert "dataset.json" not in names
    kept = os.stat(out / "train-00000-of-00003")

    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "1 complete shard kept" in r.stderr
    assert os.stat(out / "train-00000-of-00003").st_mtime_ns == kept.st_mtime_ns
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    ref = load_manifest(converted)
    for s in ref.shards("train") + ref.shards("validation"):
        assert (out / s.file).read_bytes() == open(os.path.join(converted, s.file), "rb").read()
        assert (out / s.index).read_text() == open(os.path.join(converted, s.index)).read()


def test_make_index_for_shards_without_index(converted, tmp_path):
    tf_dir = tmp_path / "tf"
    os.makedirs(tf_dir)
    ref = load_manifest(converted)
    for s in ref.shards("train") + ref.shards("validation"):
        (tf_dir / s.file).write_bytes(open(os.path.join(converted, s.file), "rb").read())
    r = subprocess.run(
        [sys.executable, "-m", "data_tools.make_index", str(tf_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    m = load_manifest(str(tf_dir))
    assert (m.num_classes, m.label_offset) == (3, 1)
    assert [c.synset for c in m.classes] == list(SYNSETS)
    for split in ("train", "validation"):
        assert m.num_examples(split) == ref.num_examples(split)
        for a, b in zip(m.shards(split), ref.shards(split)):
            assert (a.file, a.num_records, a.bytes, a.checksum) == (b.file, b.num_records, b.bytes, b.checksum)
            assert (tf_dir / a.index).read_text() == open(os.path.join(converted, b.index)).read()


@pytest.mark.parametrize("workers", ["0", "2"])
def test_ctrl_c_during_conversion_is_one_line_and_the_rerun_resumes(tiny_imagefolder, tmp_path, workers):
    out = tmp_path / "out"
    args = ["--src", tiny_imagefolder, "--out", str(out), "--train-shards", "3", "--val-shards", "2"]
    args += ["--workers", workers, "--no-progress"]
    r = subprocess.run(
        [sys.executable, "-m", "tests.helpers.kill_convert", "train-00001-of-00003:2:int", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,  # its own process group: the SIGINT reaches the converter and its workers only
    )
    assert r.returncode == -signal.SIGINT and "Traceback" not in r.stderr, r.stderr  # a shell shows 130
    last = r.stderr.strip().splitlines()[-1]
    m = re.fullmatch(
        rf"interrupted: (\d) of the 5 shards to write were written \((\d) of 5 complete in {re.escape(str(out))}\); "
        r"run the same command again to resume \(complete shards are kept\)",
        last,
    )
    assert m, last
    assert not (out / "dataset.json").exists() and not [n for n in os.listdir(out) if n.endswith(".tmp")]
    r = subprocess.run(
        [sys.executable, "-m", "data_tools.imagenet_to_tfrecord", *args], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    # The shards in progress when Ctrl-C came complete and are kept; those the pool had queued do not start
    # (with 2 workers its call queue holds 3: all 5 shards completed before they were stopped). The rerun
    # writes exactly the others.
    complete = int(m.group(2))
    assert complete < 5, last
    to_write, kept = plural(5 - complete, "shard"), plural(complete, "complete shard")
    assert f"{to_write} to write" in r.stderr and f"{kept} kept" in r.stderr, r.stderr
    assert load_manifest(str(out)).num_examples("train") == 3 * TINY_TRAIN_PER_CLASS


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` RGB pixels in its header and holds almost no data."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 4096)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a 40000x40000 RGB image needs 4.8 GB


def test_a_decompression_bomb_is_skipped_with_the_limit_named_and_no_gigabytes(tiny_imagefolder, tmp_path):
    src = copy_imagefolder(tiny_imagefolder, str(tmp_path / "src"))
    bomb = os.path.join(src, "train", SYNSETS[0], "zz_bomb.png")
    with open(bomb, "wb") as f:
        f.write(png_header_only(40000, 40000))
    r = run_module(
        "data_tools.imagenet_to_tfrecord",
        *("--src", src, "--out", str(tmp_path / "out"), "--train-shards", "3", "--val-shards", "1"),
        *("--workers", "0", "--no-progress", "--skip-bad"),
        preexec_fn=_limit_memory,
    )
    assert r.returncode == 0, r.stderr
    assert (
        f"skipped {bomb}: 1,600,000,000 pixels, more than --max-image-pixels 89,478,485 (a decompression-bomb "
        "guard; raise --max-image-pixels if you trust it)" in r.stderr
    )
