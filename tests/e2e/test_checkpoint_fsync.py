"""Crash consistency of a checkpoint save, read from the system calls a real save makes (strace -f).

Moved from tests/unit/checkpoint/test_store.py (issue 32; the test name kept): strace traces a process of
its own, and tests/unit runs in the pytest process.
"""

import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SAVE_ONE = """
import sys, torch
from vitlarge.checkpoint import store
from vitlarge.checkpoint.state import RunState
from vitlarge.checkpoint import sharded
from vitlarge.config.schema import Config
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
store.save(sys.argv[1], RunState(model, opt, torch.amp.GradScaler("cpu"), step=1), Config(), keep=2)
"""


def _joined(log: str):
    """strace -f lines with each call whole: another thread's call can split one into
    ``123 fsync(5 <unfinished ...>`` and ``123 <... fsync resumed>) = 0`` (often, on a loaded machine)."""
    pending = {}
    for line in log.splitlines():
        pid, rest = (line.split(None, 1) + [""])[:2]
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
        elif m := re.match(r"<\.\.\. \w+ resumed>(.*)$", rest):
            yield pending.pop(pid, "") + m[1]
        else:
            yield line


def syscalls(log: str) -> list[tuple]:
    """("fsync", path) and ("rename", old, new) in order, from an strace log of one process."""
    fds, events = {}, []
    for line in _joined(log):
        if m := re.search(r'openat\(AT_FDCWD, "([^"]+)", .*\)\s+= (\d+)$', line):
            fds[m[2]] = m[1]
        elif m := re.search(r"fsync\((\d+)\)\s+= 0", line):
            events.append(("fsync", fds[m[1]]))
        elif m := re.search(r'rename(?:at2?)?\((?:AT_FDCWD, )?"([^"]+)", (?:AT_FDCWD, )?"([^"]+)"', line):
            events.append(("rename", m[1], m[2]))
    return events


def test_every_file_is_fsynced_before_the_folder_is_published(tmp_path):
    """Crash consistency, read from the system calls a real save makes (strace): each file's bytes,
    then the folder's names, are on disk before the rename that gives the folder its final name."""
    if not shutil.which("strace"):
        pytest.skip("strace is not installed")
    log = tmp_path / "strace.log"
    r = subprocess.run(
        [
            "strace",
            "-f",
            "-qq",
            "-e",
            "trace=openat,fsync,rename,renameat,renameat2",
            "-o",
            str(log),
            sys.executable,
            "-c",
            SAVE_ONE,
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if r.returncode and "ptrace" in r.stderr:
        pytest.skip(f"strace cannot trace here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    root = tmp_path / "run" / "checkpoints"
    tmp, final = str(root / ".step_0000001.tmp"), root / "step_0000001"
    events = syscalls(log.read_text())
    published = events.index(("rename", tmp, str(final)))
    before, after = events[:published], events[published + 1 :]
    for name in sorted(p.name for p in final.iterdir()):
        written = f"{tmp}/{name}.tmp" if name == "meta.json" else f"{tmp}/{name}"  # meta.json is itself atomic
        assert ("fsync", written) in before, f"{name} was not fsynced before the folder was published"
    assert before.index(("fsync", tmp)) > before.index(("rename", f"{tmp}/meta.json.tmp", f"{tmp}/meta.json"))
    assert ("fsync", str(root)) in after and ("fsync", str(root.parent)) in after
