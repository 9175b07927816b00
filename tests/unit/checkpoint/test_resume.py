"""vitlarge/checkpoint/resume.py in one process: which checkpoint a run continues from, and what is moved aside.

The multi-process paths (rank 0's choice broadcast to ranks that see other folders, a rank that
cannot read the choice) are in tests/e2e/reliability/test_resume_paths.py.
"""

import json
import logging
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT
from vitlarge.checkpoint import resume, store
from vitlarge.checkpoint.state import RunState
from vitlarge.checkpoint.trust import layout
from vitlarge.config.load import load_recipe
from vitlarge.config.schema import OptimConfig
from vitlarge.errors import UserError
from vitlarge.model.vit import build_model
from vitlarge.optim.lamb import build_optimizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cfg():
    return load_recipe(ROOT / "recipes" / "demo_digits.py")


@pytest.fixture
def parts(cfg):
    torch.manual_seed(0)
    model = build_model(cfg)
    return model, build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1)), torch.amp.GradScaler("cpu")


def line(workdir: Path, cfg, parts, steps) -> list[Path]:
    model, opt, scaler = parts
    return [store.save(workdir, RunState(model, opt, scaler, step=s, data=f"data@{s}"), cfg, keep=10) for s in steps]


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def abandoned(workdir: Path) -> list[Path]:
    return sorted((workdir / "checkpoints").glob("abandoned_*"))


def test_automatic_resume_takes_the_newest_that_passes_and_moves_the_failed_aside(tmp_path, cfg, parts, caplog):
    ckpts = line(tmp_path, cfg, parts, (2, 4, 6))
    (ckpts[2] / "__0_0.distcp").write_bytes(b"")  # zero-length weights in the newest
    (ckpts[1] / "meta.json").write_text("{")  # meta.json not JSON in the one before
    with caplog.at_level(logging.INFO, logger="vitlarge"):
        chosen = resume.choose(tmp_path, None, parts[0], cfg).path
    assert chosen == ckpts[0]
    warnings = [r.getMessage() for r in caplog.records if r.name == "vitlarge"]
    assert warnings[:2] == [
        f"warning: checkpoint {ckpts[2]} fails its check (__0_0.distcp has 0 bytes, meta.json records "
        f"{layout.read_meta(ckpts[0])['files']['__0_0.distcp']['bytes']:,}); passed over",
        f"warning: checkpoint {ckpts[1]} fails its check (meta.json is not JSON: Expecting property name enclosed "
        "in double quotes: line 1 column 2 (char 1)); passed over",
    ]
    # Nothing lost: both are moved, whole, into one named folder; the next automatic resume agrees.
    [aside] = abandoned(tmp_path)
    assert aside.name.startswith("abandoned_") and aside.name.endswith("_from_step_0000002")
    assert names(aside) == ["step_0000004", "step_0000006"] and names(aside / "step_0000006") == names(ckpts[0])
    assert len(warnings) == 3 and warnings[2].startswith(
        f"moved 2 checkpoint(s) newer than step 2 (step_0000004, step_0000006) aside to {aside}"
    )
    assert [p.name for p in layout.list_checkpoints(tmp_path)] == ["step_0000002"]
    assert resume.choose(tmp_path, None, parts[0], cfg).path == ckpts[0]


def test_resume_of_an_older_step_sets_the_newer_line_aside_and_saves_over_its_names(tmp_path, cfg, parts, caplog):
    ckpts = line(tmp_path, cfg, parts, (2, 4, 6, 8))
    with caplog.at_level(logging.INFO, logger="vitlarge"):
        assert resume.choose(tmp_path, ckpts[1], parts[0], cfg).path == ckpts[1]
    [aside] = abandoned(tmp_path)
    assert [r.getMessage() for r in caplog.records if r.name == "vitlarge"] == [
        f"moved 2 checkpoint(s) newer than step 4 (step_0000006, step_0000008) aside to {aside}; "
        f"this run continues from {ckpts[1]}"
    ]
    assert names(aside) == ["step_0000006", "step_0000008"]
    assert all(store.verify(p) is None for p in aside.iterdir())  # moved whole
    line(tmp_path, cfg, parts, (6,))  # before: os.replace onto step_0000006 raised ENOTEMPTY
    assert store.latest(tmp_path) == ckpts[2]


def test_resume_from_another_workdir_starts_this_workdirs_line_with_a_copy(tmp_path, cfg, parts):
    """Its own step 4 and later are set aside; the run loads a copy, so a requeue before the first
    save comes back to step 4 of the other workdir, not to this workdir's step 2."""
    other = line(tmp_path / "other", cfg, parts, (4,))[0]
    here = line(tmp_path / "here", cfg, parts, (2, 4, 6))
    chosen = resume.choose(tmp_path / "here", other, parts[0], cfg).path
    assert chosen == here[1] and store.verify(chosen) is None
    linked = {f.name: f.stat().st_ino for f in chosen.iterdir() if f.name != "meta.json"}
    assert linked == {f.name: f.stat().st_ino for f in other.iterdir() if f.name != "meta.json"}
    # meta.json is the copy's own: the same record, naming the line the copy starts (see the line tests below)
    assert layout.read_meta(chosen) == {**layout.read_meta(other), "line": resume.lineage_of(other)}
    [aside] = abandoned(tmp_path / "here")
    assert names(aside) == ["step_0000004", "step_0000006"]
    assert store.latest(tmp_path / "here") == chosen
    assert store.verify(other) is None and layout.list_checkpoints(tmp_path / "other") == [other]


def test_resume_of_a_bad_checkpoint_is_one_line_and_moves_nothing(tmp_path, cfg, parts):
    ckpts = line(tmp_path, cfg, parts, (2, 4, 6))
    f = ckpts[1] / ".metadata"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(UserError) as e:
        resume.choose(tmp_path, ckpts[1], parts[0], cfg)
    assert str(e.value) == (
        f"checkpoint {ckpts[1]} fails its check (.metadata has 100 bytes, meta.json records "
        f"{layout.read_meta(ckpts[0])['files']['.metadata']['bytes']:,}); --resume an older "
        "checkpoints/step_* folder, or omit --resume to take the newest one that passes"
    )
    assert abandoned(tmp_path) == [] and layout.list_checkpoints(tmp_path) == ckpts


@pytest.mark.parametrize("where", ["workdir", "checkpoints", "elsewhere"])
def test_resume_of_a_folder_that_is_not_a_checkpoint_says_which_to_pass(tmp_path, cfg, parts, where):
    ckpts = line(tmp_path, cfg, parts, (2, 4))
    target = {"workdir": tmp_path, "checkpoints": tmp_path / "checkpoints", "elsewhere": tmp_path / "x"}[where]
    target.mkdir(exist_ok=True)
    with pytest.raises(UserError) as e:
        resume.choose(tmp_path, target, parts[0], cfg)
    example = "" if where == "elsewhere" else f", e.g. {ckpts[1]}"
    assert str(e.value) == (
        f"{target} is not a complete vitlarge checkpoint (no meta.json); pass a checkpoints/step_* folder{example}"
    )


def test_checkpoint_of_another_recipe_is_refused_and_nothing_moves(tmp_path, cfg, parts):
    other = load_recipe(ROOT / "recipes" / "demo_digits.py")
    other.model.kwargs = dict(cfg.model.kwargs, depth=2)
    torch.manual_seed(0)
    model = build_model(other)
    ckpts = line(
        tmp_path,
        other,
        (model, build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1)), torch.amp.GradScaler("cpu")),
        (2, 4),
    )
    (ckpts[1] / "__0_0.distcp").write_bytes(b"")
    with pytest.raises(UserError, match=f"checkpoint {ckpts[0]} holds model .* does not match the recipe"):
        resume.choose(tmp_path, None, parts[0], cfg)
    assert abandoned(tmp_path) == [] and layout.list_checkpoints(tmp_path) == ckpts


def test_restore_loads_the_choice(tmp_path, cfg, parts):
    ckpt = line(tmp_path, cfg, parts, (3,))[0]
    state = resume.restore(ckpt, RunState(*parts), cfg)
    assert (state.step, state.data_state) == (3, "data@3")


def test_restore_names_the_rank_and_the_path(tmp_path, cfg, parts):
    ckpt = line(tmp_path, cfg, parts, (3,))[0]
    (ckpt / "rank_00000.pt").unlink()
    with pytest.raises(UserError) as e:
        resume.restore(ckpt, RunState(*parts), cfg)
    assert str(e.value).startswith(f"rank 0 cannot read checkpoint {ckpt} (rank_00000.pt is missing); ")
    assert e.value.same_on_all_ranks


# Lines: a requeue replays ``--resume X``; the run continues the line that started at X, moves nothing
# aside and never rolls back, also after X itself was pruned (the run through train.py:
# tests/e2e/test_requeue.py).


def save_line(workdir: Path, cfg, parts, steps, line=None, keep=10) -> list[Path]:
    model, opt, scaler = parts
    return [
        store.save(workdir, RunState(model, opt, scaler, step=s, data=f"data@{s}", lineage=line), cfg, keep=keep)
        for s in steps
    ]


def test_the_same_resume_again_continues_the_line_it_started(tmp_path, cfg, parts):
    old = save_line(tmp_path, cfg, parts, (2, 4, 6, 8))
    x = old[1]
    choice = resume.choose(tmp_path, x, parts[0], cfg)
    chosen, line = choice.path, choice.lineage
    assert chosen == x and line == resume.lineage_of(x)
    [aside] = abandoned(tmp_path)  # going back: 6 and 8 of the old line are moved, never deleted
    assert sorted(p.name for p in aside.iterdir()) == ["step_0000006", "step_0000008"]
    # This run writes 6 and 8 of its own line; keep=2 prunes X itself.
    save_line(tmp_path, cfg, parts, (6, 8), line=line, keep=2)
    assert not x.exists() and [p.name for p in layout.list_checkpoints(tmp_path)] == ["step_0000006", "step_0000008"]
    # The requeue runs the same command: no error for the pruned X, the line's newest, nothing moved.
    resume.check_requested(tmp_path, x)
    choice = resume.choose(tmp_path, x, parts[0], cfg)
    chosen, again = choice.path, choice.lineage
    assert chosen == tmp_path / "checkpoints" / "step_0000008" and again == line
    assert abandoned(tmp_path) == [aside]
    # An automatic resume (no --resume) keeps writing the same line.
    assert resume.choose(tmp_path, None, parts[0], cfg) == resume.Choice(chosen, line)


def test_a_line_checkpoint_that_fails_its_check_is_passed_over(tmp_path, cfg, parts):
    x = save_line(tmp_path, cfg, parts, (4,))[0]
    line = resume.lineage_of(x)
    newest = save_line(tmp_path, cfg, parts, (6, 8), line=line)
    (newest[1] / "__0_0.distcp").write_bytes(b"")
    assert resume.choose(tmp_path, x, parts[0], cfg) == resume.Choice(newest[0], line)


def test_a_resume_path_that_is_gone_and_started_no_line_here_is_an_error(tmp_path, cfg, parts):
    save_line(tmp_path, cfg, parts, (2,))
    with pytest.raises(UserError, match="does not exist"):
        resume.check_requested(tmp_path, tmp_path / "checkpoints" / "step_0000004")


def test_a_resume_from_another_workdir_is_continued_on_requeue(tmp_path, cfg, parts):
    other = save_line(tmp_path / "other", cfg, parts, (4,))[0]
    here = tmp_path / "here"
    choice = resume.choose(here, other, parts[0], cfg)
    copy, line = choice.path, choice.lineage
    assert copy == here / "checkpoints" / "step_0000004" and layout.read_meta(copy)["line"] == line
    assert choice.parent == line  # what the chosen checkpoint's meta.json names, read inside the choice
    # A requeue before the first save: the copy is the line's newest; nothing moved aside.
    again = resume.choose(here, other, parts[0], cfg)
    assert (
        again == resume.Choice(copy, line) and again.parent == layout.read_meta(copy)["line"] and abandoned(here) == []
    )


def test_layer_decay_turned_on_or_off_is_refused_in_one_line_another_value_resumes():
    from tests.helpers.recipes import demo
    from vitlarge.checkpoint.resume import optimizer_groups_changed

    cfg = demo()
    plain = {"config": cfg.to_dict()}
    legacy = {"config": {"optim": {}}}  # a checkpoint from before optim.layer_decay: two groups
    assert optimizer_groups_changed(plain, cfg) is None and optimizer_groups_changed(legacy, cfg) is None
    cfg.optim.layer_decay = 0.75
    line = optimizer_groups_changed(plain, cfg)
    assert line.startswith("optim.layer_decay=0.75, but the checkpoint was trained with 1")
    assert "set optim.layer_decay=1 to resume" in line and "model.init_from" in line and "\n" not in line
    decayed = {"config": cfg.to_dict()}
    cfg.optim.layer_decay = 0.65  # the same per-layer groups, other scales: resumes
    assert optimizer_groups_changed(decayed, cfg) is None
    cfg.optim.layer_decay = 1.0
    assert "trained with 0.75" in optimizer_groups_changed(decayed, cfg)


def test_a_checkpoint_recorded_with_model_grad_checkpointing_resumes_with_full_recompute_read(tmp_path, cfg, parts):
    """meta.json as vitlarge wrote it before train.activation_checkpointing replaced model.grad_checkpointing (the
    model section holds the old key, the train section none): an automatic resume takes it, restores it, and its
    recorded config reads as ``full``; the checkpoints stored from torch 2.5.1 (``false``) read as ``off``."""
    ckpt = line(tmp_path, cfg, parts, (3,))[0]
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["config"]["model"]["grad_checkpointing"] = True
    del meta["config"]["train"]["activation_checkpointing"]
    (ckpt / "meta.json").write_text(json.dumps(meta, indent=1))
    assert resume.choose(tmp_path, None, parts[0], cfg).path == ckpt
    loaded = resume.restore(ckpt, RunState(*parts), cfg)
    assert loaded.step == 3 and loaded.config["train"]["activation_checkpointing"] == "full"
    assert "grad_checkpointing" not in loaded.config["model"]
    for plugin in ("ddp", "fsdp"):
        stored = layout.read_meta(ROOT / "tests" / "data" / "torch251" / plugin / "step_0000020")
        assert "grad_checkpointing" not in stored["config"]["model"]
        assert stored["config"]["train"].get("activation_checkpointing", "off") == "off"


def test_another_data_source_is_refused_in_one_line_before_the_checkpoint_is_copied(tmp_path, cfg, parts):
    """A checkpoint of a TFRecord run resumed with data.source=synthetic (or the reverse): one line naming both and
    the fix, before anything is copied into this workdir (it was refused only once the loader was built, after
    `copied ...` and `resumed from ...` lines, leaving the copy behind for every later run there to trip on)."""
    import copy

    ckpt = line(tmp_path / "a", cfg, parts, (4,))[0]
    synthetic = copy.deepcopy(cfg)
    synthetic.data.source = "synthetic"
    here = tmp_path / "b"
    with pytest.raises(UserError) as e:
        resume.choose(here, ckpt, parts[0], synthetic)
    assert str(e.value) == (
        f"{ckpt}: the checkpoint being resumed was trained with data.source=tfrecord, this run has "
        "data.source=synthetic; resume with data.source=tfrecord, or pass another --workdir"
    )
    assert not (here / "checkpoints").exists() or names(here / "checkpoints") == []
