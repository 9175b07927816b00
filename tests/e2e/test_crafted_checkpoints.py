"""Crafted checkpoints where a process is the point: tests/unit runs in the pytest process, so these start one.

Moved from tests/unit/checkpoint/test_files_from_elsewhere.py (issue 32; the test names kept), which refuses the
same payloads at every entry point in process: each payload is first shown live (plain ``pickle`` reaches
``os.system``, whose ``touch`` leaves the marker), and ``python -m vitlarge.evaluate`` refuses one in one line.
"""

import pickle
import subprocess
import sys

from tests.helpers import ROOT
from tests.unit.checkpoint import test_files_from_elsewhere as unit
from tests.unit.checkpoint.test_files_from_elsewhere import poison, routes

# The unit file's fixtures, shared: the demo recipe, one real checkpoint, and a copy of it per test.
cfg, original, ckpt = unit.cfg, unit.original, unit.ckpt


def test_payload_routes_are_live_under_plain_pickle(tmp_path, original):
    """The crafted indexes below are real exploits: plain pickle runs each and still returns the index."""
    for name, payload in routes(tmp_path / "ran").items():
        (tmp_path / "ran").unlink(missing_ok=True)
        data = b"\x80\x04" + payload + b"0" + (original / ".metadata").read_bytes()[2:]
        assert type(pickle.loads(data)).__name__ == "Metadata", name
        assert (tmp_path / "ran").exists(), name


def test_evaluate_refuses_a_crafted_checkpoint_in_one_line(tmp_path, ckpt):
    marker = tmp_path / "ran"
    poison(ckpt, routes(marker)["getattr chain"])
    r = subprocess.run(
        [sys.executable, "-m", "vitlarge.evaluate", "--config", "recipes/demo_digits.py", "--checkpoint", str(ckpt)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == [
        f"error: checkpoint {ckpt} fails its check (.metadata refers to builtins.getattr, which a DCP "
        "index never holds); pass another checkpoints/step_* folder or an exported model folder as --checkpoint"
    ] or (len(lines) == 1 and "never holds" in lines[0]), r.stderr
    assert not marker.exists()
