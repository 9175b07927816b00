"""scripts/gpu_parts.py: wheels cut into parts that each fit one device command, put back together there.

Synthetic wheels (random bytes under wheel names, a few MiB; the real DALI wheel is ~190 MiB) and parts of
1 MiB stand in for the real sizes: the cut, the join and the checks do not depend on them. The command is
called through its ``main`` (tests/unit starts no process); ``pack`` is given the checkout's size instead of
asking git, and ``install`` (pip, a process) runs in the prepared device sequence's dry run (docs/GPU.md).
"""

from __future__ import annotations

import hashlib
import json
import os
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
    assert r.returncode == 2 and "is not <bundle>/<file>.whl" in r.stderr


def test_pack_refuses_two_versions_of_one_distribution_and_sizes_parts_to_the_checkout(tmp_path):
    wheels = _wheels(tmp_path / "w", {"a/gast-0.7.0-py3-none-any.whl": 10, "b/gast-0.6.0-py3-none-any.whl": 10})
    with pytest.raises(gpu_parts.PartsError, match="gast twice"):
        gpu_parts.pack(wheels, tmp_path / "p", checkout=MIB)
    # 64 MiB a command, less the checkout, the manifest's 64 KiB and the 2 MiB reserve, down to whole MiB.
    assert gpu_parts.part_budget(int(3.4 * MIB)) == 58 * MIB
    with pytest.raises(gpu_parts.PartsError, match="no room for a part"):
        gpu_parts.part_budget(62 * MIB)
