"""How a process ends: tests/unit runs in the pytest process, so these start one each.

Moved from tests/unit (issue 32; the test names kept): the status a process that joined a group leaves with
(distributed/test_launch.py, ``leave``), and TensorBoard's events written before ``os._exit``
(hooks/test_hooks.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.unit.hooks.test_hooks import _scalars

LEAVING = """
import os, sys
from vitlarge.distributed import process, launcher
process.init_distributed(launcher.DistEnv(0, 1, 0, "127.0.0.1", launcher.free_port(), "single"), "gloo")
what = sys.argv[1]
if what == "broken-stdout":  # the reader of stdout is gone; one unflushed character waits in the buffer
    r, w = os.pipe()
    os.close(r)
    sys.stdout = os.fdopen(w, "w")
    sys.stdout.write("x")
    process.leave(75)
if what == "raises-broken-stderr":  # the traceback cannot be printed: the status must stay 1
    r, w = os.pipe()
    os.close(r)
    sys.stderr = os.fdopen(w, "w")
def main():
    if what.startswith("raises"):
        raise RuntimeError("a collective timed out")
    print("trained", flush=True)
    return 0
process.main_then_leave(main)
"""


@pytest.mark.parametrize(
    "what, status", [("broken-stdout", 75), ("raises", 1), ("raises-broken-stderr", 1), ("done", 0)]
)
def test_a_process_that_joined_a_group_leaves_with_its_status(what, status):
    """The status is what torchrun and Slurm's requeue read: a preemption's 75 stays 75 when stdout's reader is gone
    (the flush raised BrokenPipeError: 120), and an exception main does not handle is printed and leaves with 1
    by the same os._exit, not through the interpreter's teardown of the group."""
    r = subprocess.run([sys.executable, "-c", LEAVING, what], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == status, r.stderr[-2000:]
    if what == "raises":
        assert r.stderr.rstrip().endswith("RuntimeError: a collective timed out")
    if what == "done":
        assert r.stdout.endswith("trained\n")  # (gloo prints its own line before)


_PREEMPTED_PROCESS = """
import os, sys
from hooks import TensorBoardHook
from tests.helpers.events import make_run, step_metrics
hook, run = TensorBoardHook(sys.argv[1]), make_run(sys.argv[1])
hook.on_train_start(run)
for s in range(1, 8):
    hook.on_step_end(run, step_metrics(s))
hook.on_close(run)
os._exit(75)  # as vitlarge.distributed.process.leave ends a preempted run
"""


def test_tensorboard_on_close_writes_every_step_before_the_process_leaves_with_os_exit(tmp_path):
    """A preempted or stopped run never reaches train end and leaves with os._exit, which ends the writer's
    thread wherever it is: on_close is what writes the queued events. (Without it, the same script loses its
    last steps when the thread lags: 1-6 of 7 in a try on this machine; that depends on timing, so not asserted.)"""
    r = subprocess.run([sys.executable, "-c", _PREEMPTED_PROCESS, str(tmp_path)], cwd=ROOT, timeout=120)
    assert r.returncode == 75
    assert [s for s, _ in _scalars(tmp_path / "tb")["train/loss"]] == list(range(1, 8))
