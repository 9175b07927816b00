"""data.source=synthetic in real train.py runs: no data directory, exact resumes (and the profiler's traces).

Two ranks (forked, tests/helpers/forked.py; gloo) of the demo recipe with no data directory, an uninterrupted
reference and a run stopped at step 5 and resumed, equal bit for bit; a phased run with DALI made
unimportable (tests/helpers/block_imports.py), stopped inside its second phase and resumed, against
its own reference. The in-process checks are in tests/unit/data/test_synthetic.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hooks.jsonl import read_metrics
from tests.helpers import ROOT, launcher
from vitlarge.data import synthetic

RECIPE = "recipes/demo_digits.py"
NO_DATA = "data.path=/nonexistent/no-data-here"  # proves that no run below reads a data directory
PHASES = "train.phases=[{'epoch': 0, 'image_size': 8}, {'epoch': 0.5, 'image_size': 12, 'eval_size': 16}]"


def train_args(workdir: Path, *extra: str) -> list[str]:
    """No --data: the recipe's data.path is replaced by a directory that does not exist."""
    return [
        "--config",
        RECIPE,
        "data.source=synthetic",
        NO_DATA,
        "--workdir",
        str(workdir),
        "train.log_every_steps=1",
        "train.checkpoint_every_steps=4",
        "train.keep_checkpoints=5",
        *extra,
    ]


def losses(workdir: Path) -> dict[int, float]:
    return {m["step"]: m["train_loss"] for m in read_metrics(str(workdir / "metrics.jsonl")) if m["event"] == "train"}


def last_eval(workdir: Path) -> dict:
    return [m for m in read_metrics(str(workdir / "metrics.jsonl")) if m["event"] == "eval"][-1]


def profiled_steps(workdir: Path) -> dict[str, list[int]]:
    """Each file under ``<workdir>/profile``, a trace (parsed as JSON), and the optimizer steps it marks
    (``ProfilerStep#N``)."""
    found = {}
    for path in sorted(p for p in (workdir / "profile").rglob("*") if p.is_file()):
        events = json.loads(path.read_text())["traceEvents"]
        found[str(path.relative_to(workdir / "profile"))] = sorted(
            {int(e["name"][13:]) for e in events if e.get("name", "").startswith("ProfilerStep#")}
        )
    return found


def test_two_rank_run_without_data_resumes_exactly(tmp_path):
    """2 forked ranks: 8 steps in one go, and 5 steps then a rerun to 8 from the step-5 checkpoint
    (mid-epoch: an epoch is 11 steps). Same losses, same final weights and evaluation, bit for bit.
    The reference records steps 3-4 with the profiler (train.profile_steps), the resumed run the part of
    4-6 after its step 5: a trace per rank with those steps only, the operator table printed once."""
    ref = tmp_path / "ref"
    r = launcher.run(train_args(ref, "train.max_steps=8", "train.profile_steps=3-4"), nproc=2)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert profiled_steps(ref) == {f"steps3-4/rank{r}.pt.trace.json": [3, 4] for r in (0, 1)}
    assert out.count("profile: top 10 operators of rank 0, steps 3-4") == 1
    assert out.count("Self CPU time total:") == 1 and "aten::" in out  # rank 0's operator table, once
    assert "Profiler clears events" not in out  # torch's warning for cycles after the first: there is one
    assert "data: synthetic, made on the device (1437 images per epoch, 512 validation images, 10 classes)" in out
    assert "total batch size = 128 = 16 (micro) x 4 (accumulation) x 2 (devices)" in out
    assert "steps per epoch = 11, total steps = 660" in out  # the recipe's plan, as on the digits
    assert sorted(losses(ref)) == list(range(1, 9))
    assert last_eval(ref)["val_images"] == 512
    export = json.loads((ref / "model" / "config.json").read_text())
    assert export["label_names"] == synthetic.class_names(10)

    run = tmp_path / "run"
    r = launcher.run(train_args(run, "train.max_steps=5"), nproc=2)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    r = launcher.run(train_args(run, "train.max_steps=8", "train.profile_steps=4-6"), nproc=2)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert f"resumed from {run / 'checkpoints'}/step_0000005 at step 5" in out
    assert profiled_steps(run) == {f"steps6-6/rank{r}.pt.trace.json": [6] for r in (0, 1)}
    assert losses(run) == losses(ref)
    assert last_eval(run)["val_top1"] == last_eval(ref)["val_top1"]
    assert last_eval(run)["val_loss"] == last_eval(ref)["val_loss"]
    launcher.assert_bitwise_equal(launcher.final_weights(ref), launcher.final_weights(run))


def no_dali_run(workdir: Path, steps: int) -> subprocess.CompletedProcess:
    """One process, with DALI (and the TFRecord reader) made unimportable, as on a machine without them."""
    args = [
        "--config",
        "recipes/demo_digits_progressive.py",
        "data.source=synthetic",
        NO_DATA,
        PHASES,
        "--workdir",
        str(workdir),
        "train.log_every_steps=1",
        "train.checkpoint_every_steps=0",
        f"train.max_steps={steps}",
    ]
    return subprocess.run(
        [sys.executable, "tests/helpers/block_imports.py", "nvidia.dali,tfrecord", "train", *args],
        cwd=ROOT,
        env=launcher.env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_phased_run_without_dali_resumes_inside_a_phase_exactly(tmp_path):
    """Phase 0 at 8 px for half an epoch (steps 1-6), phase 1 at 12 px (eval 16 px). A run of 8 steps
    against one of 7 (its final checkpoint inside phase 1) rerun to 8: equal, with no DALI importable."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    r = no_dali_run(ref, 8)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    for steps in (7, 8):
        r = no_dali_run(run, steps)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "at step 7" in r.stdout + r.stderr
    assert losses(run) == losses(ref) and sorted(losses(ref)) == list(range(1, 9))
    assert last_eval(run)["val_top1"] == last_eval(ref)["val_top1"] and last_eval(ref)["val_images"] == 512
    launcher.assert_bitwise_equal(launcher.final_weights(ref), launcher.final_weights(run))
    export = json.loads((ref / "model" / "config.json").read_text())
    assert export["pretrained_cfg"]["input_size"] == [3, 16, 16]  # the last phase's eval size
