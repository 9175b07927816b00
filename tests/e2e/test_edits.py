"""A workdir stays continuable after the edits users make between two runs.

Each case resumes a real two-rank run (forked ranks with torchrun's variables, gloo, real DALI) at step 4 under an edited recipe:
the micro batch halved (accumulation re-derived, the usual answer to out-of-memory), another crop
scale, phases added, phases removed. Each run continues to step 6 from step 4 (weights, optimizer
and step), its data stream starting a fresh epoch order, and says so in one warning line on rank 0.
"""

from __future__ import annotations

import shutil

import pytest

from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.runs import resumed_at

PHASES = "train.phases=[{'epoch': 0, 'image_size': 8}, {'epoch': 0.5, 'image_size': 16}]"
COMMON = ["train.checkpoint_every_steps=2", "train.log_every_steps=1", "train.precision=fp32"]


def run(demo_data, workdir, *overrides, recipe="recipes/demo_digits.py"):
    args = ["--config", recipe, "--data", demo_data, "--workdir", str(workdir), *COMMON, *overrides]
    return launcher.run(args, nproc=2, timeout=600)


@pytest.fixture(scope="module")
def stopped_at_4(demo_data, tmp_path_factory):
    """Two workdirs stopped after step 4: one without phases, one with."""
    out = {}
    for name, extra in (("plain", ()), ("phased", (PHASES,))):
        workdir = tmp_path_factory.mktemp(name)
        r = run(demo_data, workdir, "train.max_steps=4", *extra)
        assert r.returncode == 0, r.stderr[-3000:]
        out[name] = workdir
    return out


@pytest.mark.parametrize(
    "base, edit, says",
    [
        ("plain", ["train.micro_batch=8"], "the data or loader settings changed"),
        ("plain", ["data.crop_scale=0.5,1.0"], "the data or loader settings changed"),
        ("plain", ["data.randaugment=rand-m9-n2"], "the data or loader settings changed"),
        ("plain", [PHASES], "another train.phases list"),
        ("phased", [], "another train.phases list"),
    ],
    ids=["micro_batch_halved", "crop_scale", "randaugment", "phases_added", "phases_removed"],
)
def test_an_edited_recipe_continues_the_workdir(demo_data, stopped_at_4, tmp_path, base, edit, says):
    workdir = tmp_path / "run"
    shutil.copytree(stopped_at_4[base], workdir)
    r = run(demo_data, workdir, "train.max_steps=6", *edit)
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert [step for _, step in resumed_at(log)] == [4]
    warnings = [line for line in log.splitlines() if line.startswith("warning:") and "fresh epoch order" in line]
    assert len(warnings) == 1 and says in warnings[0], warnings
    steps = [m["step"] for m in read_metrics(str(workdir / "metrics.jsonl")) if m["event"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_a_phase_list_that_moves_a_boundary_before_the_resumed_step_is_refused(demo_data, stopped_at_4, tmp_path):
    """The phased run trained steps 1-4 at 8 px (its boundary is at epoch 0.5, step 6). A list that starts the
    16 px phase at epoch 0.1 (step 1) rewrites steps already trained: one line, exit 2, nothing moved, both for
    the automatic resume (step 4) and for ``--resume`` of the older step 2 (which would move step 4 aside)."""
    workdir = tmp_path / "run"
    shutil.copytree(stopped_at_4["phased"], workdir)
    before = sorted(p.name for p in (workdir / "checkpoints").iterdir())
    moved = "train.phases=[{'epoch': 0, 'image_size': 8}, {'epoch': 0.1, 'image_size': 16}]"
    older = workdir / "checkpoints" / "step_0000002"
    for extra, step in (([], 4), (["--resume", str(older)], 2)):
        r = run(demo_data, workdir, "train.max_steps=6", moved, *extra)
        assert r.returncode == 2, r.stderr[-3000:]  # the workers' status (bad input)
        errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
        assert len(errors) == 1, r.stderr[-3000:]
        assert f"train.phases[1] starts at step 1 (epoch 0.1), before step {step} where this run resumes" in errors[0]
        assert "model.init_from" in errors[0]
        assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == before  # no abandoned_* folder
