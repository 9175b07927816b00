"""train.py as a command: what it prints and where it stops before any data is read.

Each test runs ``python train.py`` (one process, no launcher): in a new interpreter where stderr must be exactly
one line or DALI must be unimportable, else forked from the session's pre-imported server (tests/helpers/forked.py): the dry-run plan (also for 128 devices), a bad override,
a phase batch the world size cannot divide, a missing ``model.init_from`` path (and a resume that
does not need it), and the synthetic source's dry run with DALI unimportable.
"""

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, launcher
from vitlarge.checkpoint.trust import layout

DEMO = ROOT / "recipes" / "demo_digits.py"
NO_DATA = "data.path=/nonexistent/no-data-here"  # proves that the dry run reads no data directory


def fresh(argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """``python train.py ...`` in a new interpreter: for the tests that check stderr is exactly one line, which a
    forked process cannot show (what an import prints would go to the forkserver's output, not the command's)."""
    return subprocess.run(
        [sys.executable, "train.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def train_runs():
    """The three train.py commands: the plans forked from the session's pre-imported server
    (tests/helpers/forked.py), the bad override (exactly one line; it stops before torch loads) in a new interpreter."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}  # no launcher variables: one process
    plans = {
        "dry": ["--config", "recipes/vit_b16.py", "--dry-run"],
        "wide": ["--config", "recipes/vit_b16.py", "--dry-run", "--world-size", "128"],
    }
    runs = {k: launcher.python(["train.py", *a], timeout=120, environment=env) for k, a in plans.items()}
    runs["bad"] = fresh(["--config", "recipes/vit_b16.py", "--dry-run", "optim.lrr=0.1"], env)
    return runs


def test_dry_run_prints_the_plan(train_runs):
    r = train_runs["dry"]
    assert r.returncode == 0, r.stderr
    assert "32768 = 256 (micro) x 128 (accumulation) x 1 (devices)" in r.stdout
    assert "11700 steps, 5850 warmup steps" in r.stdout


def test_dry_run_plans_for_world_size_processes_in_one(train_runs):
    """``--world-size 128`` plans 128 devices from one process (no launcher, nothing started)."""
    r = train_runs["wide"]
    assert r.returncode == 0, r.stderr
    assert "32768 = 256 (micro) x 1 (accumulation) x 128 (devices)" in r.stdout
    assert r.stdout.count("32768 = ") == 1 and "train.plugin=ddp, 128 devices" in r.stdout


def test_bad_override_exits_2_with_one_line(train_runs):
    r = train_runs["bad"]
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and "did you mean 'optim.lr'" in lines[0]
    assert "Traceback" not in r.stderr


def test_a_phase_batch_the_world_size_cannot_divide_fails_in_train_py_before_the_data(tmp_path):
    """Exit 2 with one line, although --data does not exist: the phases are checked first."""
    r = fresh(
        [
            "--config",
            str(DEMO),
            "--data",
            str(tmp_path / "none"),
            "--dry-run",
            "train.phases=[{'epoch': 0}, {'epoch': 30, 'global_batch': 96, 'micro_batch': 16}]",
        ],
        # Rank 0 of 4 alone: after its error it waits for the others to hear (min(30 s, the rendezvous timeout)).
        {
            "WORLD_SIZE": "4",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "PATH": "/usr/bin:/bin",
            "VITLARGE_RENDEZVOUS_TIMEOUT": "2",
        },
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "error: train.phases[1]: global_batch=96 is not divisible by micro_batch x world size = "
        "16 x 4 = 64; pick a micro_batch or device count that divides it"
    )


def test_a_missing_path_fails_in_train_py_before_the_data(demo_data, tmp_path):
    missing = tmp_path / "nothing" / "model"
    r = fresh(
        ["--config", str(DEMO), "--data", demo_data, "--workdir", str(tmp_path / "run")]
        + [f"model.init_from={missing}"]
    )
    assert r.returncode == 2
    # Said before the imports and the rendezvous (10-20 s), after the recipe loaded.
    assert r.stdout.startswith(f"vitlarge: {DEMO} on 1 process: loading PyTorch and Colossal-AI"), r.stdout
    assert r.stderr.strip() == (
        f"error: model.init_from={missing} does not exist; pass an export folder "
        "(<workdir>/model), a checkpoints/step_* folder or a timm checkpoint file"
    )


def test_a_resume_does_not_need_the_init_from_file(tmp_path):
    """With a checkpoint in the workdir the run resumes from it: a pretrained file deleted since is not
    looked at, so train.py gets past it and stops at the next problem (here: no data)."""
    missing = tmp_path / "gone" / "model"
    work = tmp_path / "run"
    (work / "checkpoints" / layout.step_name(10)).mkdir(parents=True)
    r = launcher.python(
        ["train.py", "--config", str(DEMO), "--data", str(tmp_path / "no_data"), "--workdir", str(work)]
        + [f"model.init_from={missing}"],
        environment=dict(os.environ),
    )
    assert r.returncode == 2 and "init_from" not in r.stderr and "no_data" in r.stderr, r.stderr


def test_dry_run_needs_no_data_and_plans_imagenet_steps():
    """--dry-run with the synthetic source: no data, DALI unimportable, the recipe's ImageNet step counts."""
    r = subprocess.run(
        [
            sys.executable,
            "tests/helpers/block_imports.py",
            "nvidia.dali,tfrecord",
            "train",
            "--config",
            "recipes/vit_b16.py",
            "data.source=synthetic",
            NO_DATA,
            "--dry-run",
        ],
        cwd=ROOT,
        env=launcher.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "data synthetic (made on the device, no files)" in r.stdout
    assert "39 steps/epoch, 11700 steps, 5850 warmup steps" in r.stdout  # 1,281,167 // 32768 = 39
