"""A collective that times out: every rank ends with one line and a status of its own (issue 31).

Two ranks of the demo recipe (forked with torchrun's variables, tests/helpers/forked.py; gloo; synthetic data),
``train.collective_timeout_s=3``: rank 1 is frozen with SIGSTOP once step 1 is in metrics.jsonl (the stall stays
outside the run: a signal from the test, as tests/e2e/reliability/test_kill.py freezes a checkpoint write). Rank 0
then waits in its next collective for 3 s, not for ``train.init_timeout_s`` (60 here: the group's timeout was
lowered after step 1), and ends with `vitlarge.errors.EXIT_COLLECTIVE_TIMEOUT` and one line naming the collective
and rank 1. Rank 1, resumed after rank 0 has gone, ends with one line too, without a traceback.
"""

from __future__ import annotations

import os
import re
import signal

from tests.helpers import ROOT, launcher
from tests.helpers.forked import Job
from tests.helpers.runs import metrics_has_step
from vitlarge.errors import EXIT_COLLECTIVE_TIMEOUT

RECIPE = "recipes/demo_digits.py"


def test_a_stalled_rank_ends_the_run_with_one_line_per_rank(tmp_path):
    workdir = tmp_path / "run"
    args = [
        "train.py",
        "--config",
        RECIPE,
        "data.source=synthetic",
        "data.path=/nonexistent/no-data-here",
        "--workdir",
        str(workdir),
        "train.max_steps=400",  # far more than the test lets it run: the stall comes first
        "train.checkpoint_every_steps=0",
        "train.eval_every_epochs=0",
        "train.init_timeout_s=60",
        "train.collective_timeout_s=3",
    ]
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    job = Job(args, 2, launcher.env(), ROOT, out, err, launcher.free_port())
    rank0, rank1 = job.ranks
    try:
        assert launcher.wait_for(metrics_has_step(workdir, 1), 300, rank0), err.read_text()[-3000:]
        os.kill(rank1.pid, signal.SIGSTOP)
        status0 = rank0.wait(120)
        os.kill(rank1.pid, signal.SIGCONT)
        status1 = rank1.wait(120)
    finally:
        job.kill()
    lines = err.read_text().splitlines()
    assert status0 == EXIT_COLLECTIVE_TIMEOUT, lines[-30:]
    assert "Traceback (most recent call last):" not in lines, lines[-30:]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 2, lines[-30:]
    # where rank 1 froze decides where rank 0 waits: the loss all-reduce, DDP's gradient all-reduce in backward, or
    # a collective DDP starts from C++ (in its forward: named by the innermost torch function)
    op = (
        r"(all_reduce \(vitlarge/train/loop\.py:_sync\)|(DDP's gradient all-reduce|a collective in "
        r"torch/[\w/]+\.py:\w+) \(vitlarge/train/engine\.py:step\))"
    )
    mine = rf"^error: {op} timed out on rank 0 of 2 after 3s \(gloo: .*Timed out waiting 3000ms.*\); rank 1 "
    assert any(re.match(mine + "did not report it within 3s", line) for line in errors), errors
    # rank 1 meets the same collective after rank 0 has gone: it timed out too, or found its peer gone
    assert any(re.match(rf"^error: {op} (timed out|failed) on rank 1 of 2", line) for line in errors), errors
    assert status1 in (1, EXIT_COLLECTIVE_TIMEOUT)
