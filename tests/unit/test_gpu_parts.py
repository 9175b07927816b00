"""scripts/gpu_parts.py: wheels cut into parts that each fit one device command, put back together there.

Synthetic wheels (random bytes under wheel names, a few MiB; the real DALI wheel is ~190 MiB) and parts of
1 MiB stand in for the real sizes: the cut, the join and the checks do not depend on them. The command is
called through its ``main`` (tests/unit starts no process); ``pack`` is given the checkout's size instead of
asking git, and ``install`` (pip, a process) runs in the prepared device sequence's dry run (docs/GPU_SESSION.md).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import stat
import tarfile
import tempfile
import tracemalloc
from pathlib import Path

import pytest

from scripts import gpu_parts
from tests.helpers import call_main

MIB = 2**20


def _wheels(root: Path, sizes: dict[str, int]) -> Path:
    rng = __import__("random").Random(7)
    for path, size in sizes.items():
        f = root / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(rng.randbytes(size))
    return root


@pytest.fixture
def packed(tmp_path):
    wheels = _wheels(
        tmp_path / "wheels",
        {
            "dali/nvidia_dali_cuda130-2.4.0-py3-none-manylinux_2_28_x86_64.whl": 3 * MIB + 12345,
            "dali/gast-0.7.0-py3-none-any.whl": 23_000,
            "colossalai/colossalai-0.5.0-py3-none-any.whl": MIB + 1,
        },
    )
    m = gpu_parts.pack(wheels, tmp_path / "parts", part_bytes=MIB, checkout=3 * MIB)
    return wheels, tmp_path / "parts", m


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_parts_fit_one_command_each_and_join_to_the_same_wheels(packed, tmp_path):
    wheels, parts, m = packed
    assert len(m["parts"]) == 5 == -(-m["payload"]["bytes"] // MIB)  # 4 MiB and 70 KB of wheels and tar headers
    assert all(p["bytes"] <= MIB for p in m["parts"])
    assert sum(p["bytes"] for p in m["parts"]) == m["payload"]["bytes"]
    stage = tmp_path / "stage"
    # One command per part: the checkout's folder holds only the part it carried (and the manifest).
    for i, p in enumerate(m["parts"]):
        carried = tmp_path / f"cmd{i}"
        carried.mkdir()
        os.link(parts / gpu_parts.MANIFEST, carried / gpu_parts.MANIFEST)
        os.link(parts / p["name"], carried / p["name"])
        r = call_main("scripts.gpu_parts", "receive", str(carried), "--stage", str(stage))
        assert r.returncode == 0, r.stderr
        assert f"{i + 1} of 5 parts staged" in r.stdout
    got, have = gpu_parts.receive(parts.parent / "cmd4", stage)
    out = gpu_parts.assemble(got, stage, have)
    for w in m["wheels"]:
        assert _sha(out / w["path"]) == _sha(wheels / w["path"]) == w["sha256"]
    assert not list(stage.glob("part-*")), "joined parts are removed"


def test_a_missing_part_is_one_line_naming_it(packed, tmp_path):
    _, parts, m = packed
    (parts / "part-03").unlink()
    r = call_main(
        "scripts.gpu_parts", "install", str(parts), "--stage", str(tmp_path / "s"), "--target", str(tmp_path / "t")
    )
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("gpu_parts: missing part-03 (3 of 5, 1.0 MiB)")
    assert "carry .gpu/parts/part-03" in lines[0] and "part-01, part-02, part-04, part-05" in lines[0]
    assert not (tmp_path / "t").exists(), "nothing installed"


def test_a_damaged_part_is_refused_before_it_is_staged(packed, tmp_path):
    _, parts, _ = packed
    data = bytearray((parts / "part-02").read_bytes())
    data[100] ^= 1
    (parts / "part-02").write_bytes(bytes(data))
    r = call_main("scripts.gpu_parts", "receive", str(parts), "--stage", str(tmp_path / "s"))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "part-02 (2 of 5, 1.0 MiB)" in r.stderr and "sha256" in r.stderr
    assert not (tmp_path / "s" / "part-02").exists()


def test_parts_of_another_packing_are_not_joined(packed, tmp_path):
    wheels, parts, _ = packed
    stage = tmp_path / "stage"
    gpu_parts.receive(parts, stage)  # all five staged
    (wheels / "dali" / "gast-0.7.0-py3-none-any.whl").write_bytes(b"another build")
    other = tmp_path / "parts2"
    gpu_parts.pack(wheels, other, part_bytes=MIB, checkout=3 * MIB)
    (other / "part-02").unlink()
    m, have = gpu_parts.receive(other, stage)
    assert 1 not in have, "the old packing's part-02 was dropped, not taken for the new one's"
    with pytest.raises(gpu_parts.PartsError, match="missing part-02"):
        gpu_parts.assemble(m, stage, have)


def test_without_the_manifest_or_with_a_crafted_one_it_says_so(packed, tmp_path):
    _, parts, m = packed
    bare = tmp_path / "bare"
    bare.mkdir()
    r = call_main("scripts.gpu_parts", "receive", str(bare), "--stage", str(tmp_path / "s"))
    assert r.returncode == 2 and "manifest.json is not here" in r.stderr
    crafted = dict(m, wheels=[dict(m["wheels"][0], path="../../etc/x.whl")])
    (parts / gpu_parts.MANIFEST).write_text(json.dumps(crafted))
    r = call_main("scripts.gpu_parts", "receive", str(parts), "--stage", str(tmp_path / "s"))
    assert r.returncode == 2 and "wheels[0].path is '../../etc/x.whl', not a <bundle>/<file>.whl" in r.stderr


def test_pack_refuses_two_versions_of_one_distribution_and_sizes_parts_to_the_checkout(tmp_path):
    wheels = _wheels(tmp_path / "w", {"a/gast-0.7.0-py3-none-any.whl": 10, "b/gast-0.6.0-py3-none-any.whl": 10})
    with pytest.raises(gpu_parts.PartsError, match="gast twice"):
        gpu_parts.pack(wheels, tmp_path / "p", checkout=MIB)
    # 64 MiB a command, less the checkout, the manifest's 64 KiB and the 2 MiB reserve, down to whole MiB.
    assert gpu_parts.part_budget(int(3.4 * MIB)) == 58 * MIB
    with pytest.raises(gpu_parts.PartsError, match="no room for a part"):
        gpu_parts.part_budget(62 * MIB)


# Crafted bundles and stages: a manifest, a part or a stage folder from elsewhere is data, confined to the stage.


def _manifest(parts: Path) -> dict:
    return json.loads((parts / gpu_parts.MANIFEST).read_text())


def _one_line_refusal(r, *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_parts: "), r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("name", ["ABS", "../victim", "sub/wheels.tar", "..", "manifest.json", "part-01", "wheels"])
def test_a_payload_name_that_is_not_a_plain_tar_name_is_refused_before_anything_is_written(packed, tmp_path, name):
    _, parts, m = packed
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    name = str(victim) if name == "ABS" else name
    (parts / gpu_parts.MANIFEST).write_text(json.dumps(dict(m, payload=dict(m["payload"], name=name))))
    stage = tmp_path / "stage"
    r = call_main("scripts.gpu_parts", "receive", str(parts), "--stage", str(stage))
    _one_line_refusal(r, str(parts / gpu_parts.MANIFEST), "payload.name")
    assert victim.read_bytes() == b"precious"
    assert not (stage.exists() and any(stage.iterdir())), "nothing staged from a refused manifest"


def test_without_stage_each_command_gets_a_fresh_private_folder(packed, tmp_path, monkeypatch):
    _, parts, _ = packed
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes it: watched, then removed
    r = call_main("scripts.gpu_parts", "receive", str(parts))
    assert r.returncode == 0, r.stderr
    (stage,) = tmp_path.glob("vitlarge-parts-*")
    assert f"staged in {stage}" in r.stdout and f"--stage {stage}" in r.stdout  # what the next command is given
    assert stat.S_IMODE(stage.stat().st_mode) == 0o700 and (stage / "part-05").is_file()


@pytest.mark.parametrize("how", ["link", "world-writable", "group-writable", "a file", "another owner"])
def test_a_named_stage_that_is_not_private_is_refused(packed, tmp_path, how):
    _, parts, _ = packed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    stage = tmp_path / "stage"
    if how == "link":
        stage.symlink_to(elsewhere)
    elif how == "a file":
        stage.write_bytes(b"")
    else:
        stage.mkdir(mode=0o700)
        if how == "another owner":
            if os.geteuid() != 0:
                pytest.skip("giving a folder to another user needs root")
            os.chown(stage, 65534, 65534)
        else:
            os.chmod(stage, 0o777 if how == "world-writable" else 0o770)
    r = call_main("scripts.gpu_parts", "receive", str(parts), "--stage", str(stage))
    _one_line_refusal(r, str(stage), "--stage")
    assert not any(elsewhere.iterdir()) and not (stage.is_dir() and any(stage.iterdir()))
    assert (parts / "part-01").is_file(), "the carried parts stay where they came"


@pytest.mark.parametrize("planted", [".part-01.tmp", "manifest.json", "wheels"])
def test_a_link_planted_in_the_stage_is_refused_never_followed(packed, tmp_path, planted):
    _, parts, _ = packed
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(b"precious")
    stage = tmp_path / "stage"
    stage.mkdir(mode=0o700)
    (stage / planted).symlink_to(outside if planted == "wheels" else victim)
    r = call_main("scripts.gpu_parts", "install", str(parts), "--stage", str(stage), "--target", str(tmp_path / "site"))
    _one_line_refusal(r, str(stage / planted), "link")
    assert victim.read_bytes() == b"precious" and [p.name for p in outside.iterdir()] == ["victim"]
    assert not (tmp_path / "site").exists(), "nothing installed"


def test_a_sparse_oversized_manifest_is_refused_by_its_cap_not_read_whole(packed, tmp_path):
    _, parts, _ = packed
    with open(parts / gpu_parts.MANIFEST, "r+b") as f:
        f.truncate(1_500_000_000)  # sparse: 1.5 GB that cost nothing to make, nor must to refuse
    tracemalloc.start()  # what was read, not how long it took (a loaded machine is slow at anything)
    try:
        r = call_main("scripts.gpu_parts", "receive", str(parts), "--stage", str(tmp_path / "s"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _one_line_refusal(r, str(parts / gpu_parts.MANIFEST), "cap")
    assert peak < 4 * gpu_parts.MANIFEST_CAP, f"{peak:,} bytes allocated: the manifest was read past its cap"


@pytest.mark.parametrize("kind", ["fifo", "folder", "link"])
def test_a_manifest_that_is_not_a_regular_file_is_refused_without_waiting(packed, tmp_path, kind):
    _, parts, _ = packed
    man = parts / gpu_parts.MANIFEST
    man.rename(tmp_path / "real.json")
    if kind == "fifo":
        os.mkfifo(man)
    elif kind == "folder":
        man.mkdir()
    else:
        man.symlink_to(tmp_path / "real.json")

    def hang(*_):
        raise TimeoutError("the manifest's read did not return in 3 s")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(3)
    try:
        r = call_main("scripts.gpu_parts", "receive", str(parts), "--stage", str(tmp_path / "s"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    _one_line_refusal(r, str(man), "regular file")


MALFORMED = {
    "not JSON": (None, b"{'format': 1"),
    "a list": (None, b"[]"),
    "nested deeply": (None, b"[" * 100_000),
    "version": ("version", lambda m: m.update(version="2")),
    "payload missing": ("payload", lambda m: m.pop("payload")),
    "payload not an object": ("payload", lambda m: m.update(payload=[])),
    "payload bytes a string": ("payload.bytes", lambda m: m["payload"].update(bytes="12")),
    "payload sha256 short": ("payload.sha256", lambda m: m["payload"].update(sha256="abc")),
    "parts missing": ("parts", lambda m: m.pop("parts")),
    "parts empty": ("parts", lambda m: m.update(parts=[])),
    "part a string": ("parts[1]", lambda m: m["parts"].__setitem__(1, "part-02")),
    "part sha256 missing": ("parts[0].sha256", lambda m: m["parts"][0].pop("sha256")),
    "part bytes negative": ("parts[2].bytes", lambda m: m["parts"][2].update(bytes=-1)),
    "part bytes a bool": ("parts[2].bytes", lambda m: m["parts"][2].update(bytes=True)),
    "part bytes past a command": ("parts[2].bytes", lambda m: m["parts"][2].update(bytes=2**40)),
    "part named twice": ("parts[1].name", lambda m: m["parts"][1].update(name="part-01")),
    "parts not the payload's sum": ("payload.bytes", lambda m: m["payload"].update(bytes=m["payload"]["bytes"] + 1)),
    "wheels missing": ("wheels", lambda m: m.pop("wheels")),
    "wheel bytes a float": ("wheels[0].bytes", lambda m: m["wheels"][0].update(bytes=1.5)),
    "wheel sha256 a number": ("wheels[1].sha256", lambda m: m["wheels"][1].update(sha256=7)),
    "wheel listed twice": ("wheels[1].path", lambda m: m["wheels"][1].update(path=m["wheels"][0]["path"])),
    "wheels past the payload": ("wheels", lambda m: m["wheels"][0].update(bytes=m["payload"]["bytes"])),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_manifest_is_one_line_naming_the_file_and_key(packed, tmp_path, case):
    _, parts, m = packed
    key, edit = MALFORMED[case]
    if isinstance(edit, bytes):
        raw = edit
    else:
        edit(m)
        raw = json.dumps(m).encode()
    (parts / gpu_parts.MANIFEST).write_bytes(raw)
    r = call_main(
        "scripts.gpu_parts", "install", str(parts), "--stage", str(tmp_path / "s"), "--target", str(tmp_path / "t")
    )
    line = _one_line_refusal(r, str(parts / gpu_parts.MANIFEST))
    if key:
        assert f" {key} " in line or f" {key}:" in line, line
    assert not (tmp_path / "t").exists()


def _repack_as(parts: Path, m: dict, payload: bytes, payload_sha: str | None = None) -> None:
    """The bundle's parts replaced by ``payload`` cut in two, with a manifest whose hashes match them (a forger's)."""
    for p in m["parts"]:
        (parts / p["name"]).unlink()
    half = len(payload) // 2
    m["parts"] = []
    for i, chunk in enumerate((payload[:half], payload[half:])):
        (parts / f"part-0{i + 1}").write_bytes(chunk)
        m["parts"].append({"name": f"part-0{i + 1}", "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    m["payload"] = {
        "name": "wheels.tar",
        "bytes": len(payload),
        "sha256": payload_sha or hashlib.sha256(payload).hexdigest(),
    }
    m["wheels"] = [dict(m["wheels"][0], bytes=len(payload) // 4)]
    (parts / gpu_parts.MANIFEST).write_text(json.dumps(m))


@pytest.mark.parametrize("junk", ["not a tar", "joined sha256 not the manifest's"])
def test_junk_parts_leave_nothing_under_the_final_name(packed, tmp_path, junk):
    _, parts, m = packed
    payload = os.urandom(40_000)
    _repack_as(parts, m, payload, "0" * 64 if junk.startswith("joined") else None)
    stage = tmp_path / "stage"
    r = call_main("scripts.gpu_parts", "install", str(parts), "--stage", str(stage), "--target", str(tmp_path / "t"))
    _one_line_refusal(r, "wheels.tar", "tar" if junk == "not a tar" else "sha256")
    assert sorted(p.name for p in stage.iterdir()) == ["manifest.json", "part-01", "part-02"]
    assert not (tmp_path / "t").exists()


def test_a_tar_with_an_oversized_extended_header_is_refused_before_tarfile_reads_it(packed, tmp_path):
    """tarfile holds a pax header whole and parses it with a regular expression (100 MiB: 21 s, 330 MB, on the
    2-core Intel Xeon); pack's are a few hundred bytes. A forged bundle's, hashes matching, is refused unread."""
    _, parts, m = packed
    wheel = os.urandom(1000)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("dali/gast-0.7.0-py3-none-any.whl")
        info.size, info.pax_headers = len(wheel), {"comment": "x" * 100_000}
        tar.addfile(info, io.BytesIO(wheel))
    _repack_as(parts, m, buf.getvalue())
    m["wheels"] = [{"path": info.name, "bytes": len(wheel), "sha256": hashlib.sha256(wheel).hexdigest()}]
    (parts / gpu_parts.MANIFEST).write_text(json.dumps(m))
    stage = tmp_path / "stage"
    got, have = gpu_parts.receive(parts, stage)
    with pytest.raises(gpu_parts.PartsError, match=r"wheels.tar: an extended header of 100,0\d\d bytes"):
        gpu_parts.assemble(got, stage, have)
    assert sorted(p.name for p in stage.iterdir()) == ["manifest.json", "part-01", "part-02"]


def test_a_tar_header_of_negative_size_is_one_line_not_a_walk_backwards(packed, tmp_path):
    _, parts, m = packed
    header = bytearray(tarfile.TarInfo("dali/gast-0.7.0-py3-none-any.whl").tobuf(format=tarfile.GNU_FORMAT))
    header[124:136] = b"\xff" * 10 + b"\xfc\x00"  # base-256: -1,024, two blocks back: the header again
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    _repack_as(parts, m, bytes(header) + bytes(1024))
    stage = tmp_path / "stage"
    got, have = gpu_parts.receive(parts, stage)
    with pytest.raises(gpu_parts.PartsError, match="not a tar .a header's size is -1024"):
        gpu_parts.assemble(got, stage, have)
