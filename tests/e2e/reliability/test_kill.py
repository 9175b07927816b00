"""kill -9 of a whole 2-rank run at five points, each followed by the same command: exact resume.

One run sequence (two ranks forked with torchrun's variables, tests/helpers/forked.py; 12 steps, a checkpoint every 2): kill, rerun, kill, rerun, ...
finish. Every rerun must resume from the newest *complete* checkpoint on disk (rank 0 logs
"resumed from ... at step N"), a checkpoint killed mid-write (only its ``.step_N.tmp`` folder
exists) is never chosen, and the final weights equal the uninterrupted reference bit for bit.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.runs import (
    REFERENCE_STEPS,
    assert_bitwise_equal,
    checkpoint_steps,
    final_weights,
    metrics_has_step,
    reference_run,
    resumed_at,
    train_args,
)
from vitlarge.checkpoint import store

TIMEOUT = 600


def assert_all_dead(procs: list[psutil.Process]) -> None:
    alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"survived kill -9: {alive}"


def wait_mid_write(proc, ckpt_root: Path, step: int) -> list[str]:
    """Waits for ``.step_<step>.tmp`` and freezes every process of the run the moment it appears.

    SIGSTOP first (a few system calls after the folder appears), so the write is still in progress
    when we look, then the caller sends SIGKILL. Returns what the half-written folder held.
    """
    tmp = ckpt_root / f".step_{step:07d}.tmp"
    assert launcher.wait_for(metrics_has_step(ckpt_root.parent, step - 1), TIMEOUT, proc)  # workers are up
    procs = launcher.tree(proc)  # taken before: no /proc walk between seeing the folder and stopping
    deadline = time.time() + TIMEOUT
    while not tmp.exists():
        assert proc.poll() is None and time.time() < deadline, f"{tmp} never appeared"
        time.sleep(0.001)
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    assert not (ckpt_root / f"step_{step:07d}").exists(), f"checkpoint {step} completed before the kill"
    return sorted(os.listdir(tmp)) if tmp.exists() else []


def test_kill_9_at_five_points_resumes_from_newest_complete_checkpoint_bitwise(demo_data, tmp_path_factory, tmp_path):
    ref = reference_run(demo_data, tmp_path_factory)
    workdir = tmp_path / "run"
    ckpt_root = workdir / "checkpoints"
    args = train_args(demo_data, workdir)

    def at_step(n):
        return lambda proc: launcher.wait_for(metrics_has_step(workdir, n), TIMEOUT, proc)

    def checkpoint_appears(n):
        return lambda proc: launcher.wait_for(
            (ckpt_root / f"step_{n:07d}" / "meta.json").exists, TIMEOUT, proc, poll=0.005
        )

    mid_write_step = 4
    points = [
        ("after step 1, before any checkpoint", at_step(1)),
        (f"while checkpoint {mid_write_step} is being written", None),
        ("the moment checkpoint 6 got its final name", checkpoint_appears(6)),
        ("mid-epoch, after step 9 (checkpoint 8 on disk)", at_step(9)),
        (f"during the final evaluation (after step {REFERENCE_STEPS})", at_step(REFERENCE_STEPS)),
    ]
    expected_resume: int | None = None  # what the next attempt must resume from
    history = []
    for i, (name, reached) in enumerate(points):
        log = tmp_path / f"attempt_{i}.log"
        proc = launcher.start(args, nproc=2, launcher="fork", log=log)
        try:
            if reached is None:
                half_written = wait_mid_write(proc, ckpt_root, mid_write_step)
            else:
                assert reached(proc), f"{name}: not reached\n" + log.read_text()[-3000:]
                assert proc.poll() is None, f"{name}: the run ended before the kill\n" + log.read_text()[-3000:]
            procs = launcher.tree(proc)
            assert len(launcher.workers(proc)) == 2
        finally:
            launcher.kill_tree(proc)  # SIGKILL to both ranks and anything they started
        proc.wait(timeout=60)
        assert_all_dead(procs)

        # This attempt itself resumed from what the previous kill left.
        text = log.read_text()
        if expected_resume is None:
            assert resumed_at(text) == [], text[-3000:]
        else:
            assert resumed_at(text) == [(str(ckpt_root / f"step_{expected_resume:07d}"), expected_resume)], text[-3000:]

        newest = store.latest(workdir)
        expected_resume = int(newest.name[5:]) if newest else None
        if reached is None:
            # The half-written checkpoint is left as .tmp only; the newest complete one is older.
            assert (ckpt_root / f".step_{mid_write_step:07d}.tmp").is_dir()
            assert expected_resume == mid_write_step - 2, (expected_resume, half_written)
        history.append((name, expected_resume))

    assert [s for _, s in history][:4] == [None, 2, 6, 8], history
    r = launcher.run(args, nproc=2, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert resumed_at(r.stdout + r.stderr) == [(str(ckpt_root / f"step_{expected_resume:07d}"), expected_resume)]

    assert_bitwise_equal(final_weights(ref), final_weights(workdir))
    assert not list(ckpt_root.glob(".step_*.tmp"))  # the next save removed the half-written folder
    assert checkpoint_steps(workdir) == [8, 10, 12]  # keep 3
    train = [m for m in read_metrics(str(workdir / "metrics.jsonl")) if m["event"] == "train"]
    assert [m["step"] for m in train] == list(range(1, REFERENCE_STEPS + 1))
    ref_train = [m for m in read_metrics(str(ref / "metrics.jsonl")) if m["event"] == "train"]
    assert [m["train_loss"] for m in train] == [m["train_loss"] for m in ref_train]
    print(f"\nkill -9 points survived: {len(points)}; resumed from: {[s for _, s in history]}")
