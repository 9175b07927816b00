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


def test_a_batch_edit_on_more_processes_says_what_changed_and_keeps_the_lr_continuous(
    demo_data, stopped_at_4, tmp_path
):
    """The 2-rank run stopped at step 4 (global batch 128: 11 steps per epoch, 55 warmup steps) resumed on 3 ranks
    with ``train.global_batch=96`` (14 steps per epoch): one line per change, old -> new (the epochs count on from
    the 4/11 done at 128: the 60 epochs end at step 839, the 5 warmup epochs at step 69), the lr of step 5 the
    checkpoint's plan had (the recipe's would be lower: the warmup is longer), and the continuation and the epoch
    count recorded in meta.json, from which a requeue plans the same lr and epochs (nothing changed then)."""
    import json

    from tests.helpers import ROOT
    from vitlarge.config.load import load_config
    from vitlarge.plan.plan import make_plan

    workdir = tmp_path / "run"
    shutil.copytree(stopped_at_4["plain"], workdir)
    edit = "train.global_batch=96"
    args = ["--config", "recipes/demo_digits.py", "--data", demo_data, "--workdir", str(workdir), *COMMON]
    r = launcher.run([*args, "train.max_steps=6", edit], nproc=3, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (r.stdout + r.stderr).splitlines()
    at = next(i for i, line in enumerate(log) if line.startswith("warning: the schedule changed since"))
    assert f"{workdir / 'checkpoints' / 'step_0000004'} (train.global_batch 128 -> 96)" in log[at]
    assert log[at + 1 : at + 5] == [
        "  global batch 128 -> 96",
        "  steps per epoch 11 -> 14",
        "  total steps 660 -> 839",
        "  warmup steps 55 -> 69",
    ]
    assert "  lr at step 5: 1.818e-03 in the checkpoint's plan, 1.449e-03 in this recipe's" in log[at + 5]
    ws = [line for line in log if "was written by 2 processes, this run has 3" in line]
    assert len(ws) == 1 and "resume exactly" not in ws[0] and "1 micro-steps" not in ws[0], ws
    lr = {m["step"]: m["lr"] for m in read_metrics(str(workdir / "metrics.jsonl")) if m["event"] == "train"}
    old = load_config(ROOT / "recipes" / "demo_digits.py", COMMON)
    assert lr[5] == pytest.approx(make_plan(old, 2, 1437).lr_at(old, 4), rel=1e-9)
    meta = json.loads((workdir / "checkpoints" / "step_0000006" / "meta.json").read_text())
    assert meta["schedule"]["continues"]["step"] == 4
    assert meta["schedule"]["counted_from"] == {"step": 4, "epoch": pytest.approx(4 / 11)}
    epochs = [m["epoch"] for m in read_metrics(str(workdir / "metrics.jsonl")) if m["event"] == "train"]
    assert epochs == pytest.approx([1 / 11, 2 / 11, 3 / 11, 4 / 11, 4 / 11 + 1 / 14, 4 / 11 + 2 / 14])
    assert meta["line"] is None  # an automatic resume keeps the lineage; the schedule's warning lines are not it
    from vitlarge.plan.edits import resume_plan  # a requeue's plan, from what meta.json records

    new = load_config(ROOT / "recipes" / "demo_digits.py", [*COMMON, edit])
    again = resume_plan(new, make_plan(new, 3, 1437), "x", meta["config"], meta["schedule"], 6, meta["world_size"])
    assert again.exact and again.plan.lr_at(new, 5) == pytest.approx(lr[6], rel=1e-9)
    assert again.plan.epoch_at(6) == pytest.approx(epochs[-1]) and again.plan.total_steps == 839
