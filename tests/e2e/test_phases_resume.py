"""Exact resume across a resolution change: kill -9 just after a phase boundary, then the same command.

Real processes (2 ranks forked with torchrun's variables, gloo), real DALI, the progressive demo recipe with its boundary
moved to step 6 (half an epoch at 8 px, then 12 px with another crop scale and eval size). One
uninterrupted reference; one run killed after step 7, whose newest checkpoint (step 6, the last step
of phase 0) holds phase 0's loader state: the rerun must start phase 1 (new pipelines, new size,
the model at another token grid) exactly as the uninterrupted run did. The final weights, every
step's loss and the final evaluation equal the reference's bit for bit. (A resume inside a phase
continues that phase's DALI stream: tests/unit/data/test_phased.py, real pipelines, one process.)
"""

from __future__ import annotations

from pathlib import Path

from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.runs import metrics_has_step, resumed_at

TIMEOUT = 600
LAUNCHER = "fork"  # ranks forked with torchrun's variables (tests/helpers/forked.py): the launcher is not the subject
STEPS = 9
PHASES = (
    "train.phases=[{'epoch': 0, 'image_size': 8}, "
    "{'epoch': 0.5, 'image_size': 12, 'crop_scale': (0.8, 1.0), 'eval_size': 16}]"
)


def args(data: str, workdir: Path) -> list[str]:
    return [
        "--config",
        "recipes/demo_digits_progressive.py",
        "--data",
        data,
        "--workdir",
        str(workdir),
        PHASES,
        "train.log_every_steps=1",
        f"train.max_steps={STEPS}",
        "train.checkpoint_every_steps=2",
        "train.keep_checkpoints=5",
    ]


def test_kill_9_just_after_a_phase_boundary_resumes_bitwise(demo_data, tmp_path):
    ref = tmp_path / "ref"
    r = launcher.run(args(demo_data, ref), nproc=2, launcher=LAUNCHER, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    workdir = tmp_path / "run"
    resumes = []
    for kill_after in (7,):
        log = tmp_path / f"killed_after_{kill_after}.log"
        proc = launcher.start(args(demo_data, workdir), nproc=2, launcher=LAUNCHER, log=log)
        try:
            assert launcher.wait_for(metrics_has_step(workdir, kill_after), TIMEOUT, proc), log.read_text()[-3000:]
            assert proc.poll() is None, "the run ended before the kill"
        finally:
            launcher.kill_tree(proc)
        proc.wait(timeout=60)
        resumes += resumed_at(log.read_text())
    r = launcher.run(args(demo_data, workdir), nproc=2, launcher=LAUNCHER, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    resumes += resumed_at(r.stdout + r.stderr)
    assert [step for _, step in resumes] == [6]  # at the boundary, from phase 0's state

    launcher.assert_bitwise_equal(launcher.final_weights(ref), launcher.final_weights(workdir))
    train = [m for m in read_metrics(str(workdir / "metrics.jsonl")) if m["event"] == "train"]
    ref_train = [m for m in read_metrics(str(ref / "metrics.jsonl")) if m["event"] == "train"]
    last = {m["step"]: m["train_loss"] for m in train}  # a killed attempt's steps are redone: the rerun's count
    assert sorted(last) == list(range(1, STEPS + 1))
    assert [last[s] for s in range(1, STEPS + 1)] == [m["train_loss"] for m in ref_train]
    evals = [m for m in read_metrics(str(workdir / "metrics.jsonl")) if m["event"] == "eval"]
    assert (
        evals[-1]["val_top1"]
        == [m for m in read_metrics(str(ref / "metrics.jsonl")) if m["event"] == "eval"][-1]["val_top1"]
    )
