"""A requeue replays ``--resume X``: the run continues the line that started at X, moves nothing aside
and never rolls back, also after X itself was pruned. In one process with real checkpoints
(`resume.choose` as rank 0 runs it); the run through train.py is tests/e2e/test_requeue.py.
"""

from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT
from vitlarge.checkpoint import resume, store
from vitlarge.config.load import load_recipe
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
    return model, build_optimizer(model, "lamb", lr=1e-2, weight_decay=0.1), torch.amp.GradScaler("cpu")


def save(workdir: Path, cfg, parts, steps, line=None, keep=10) -> list[Path]:
    model, opt, scaler = parts
    return [
        store.save(workdir, s, model, opt, scaler, f"data@{s}", cfg, keep=keep, extra_meta={"line": line})
        for s in steps
    ]


def abandoned(workdir: Path) -> list[Path]:
    return sorted((workdir / "checkpoints").glob("abandoned_*"))


def test_the_same_resume_again_continues_the_line_it_started(tmp_path, cfg, parts):
    old = save(tmp_path, cfg, parts, (2, 4, 6, 8))
    x = old[1]
    chosen, line = resume.choose(tmp_path, x, parts[0], cfg)
    assert chosen == x and line == resume.line_of(x)
    [aside] = abandoned(tmp_path)  # going back: 6 and 8 of the old line are moved, never deleted
    assert sorted(p.name for p in aside.iterdir()) == ["step_0000006", "step_0000008"]
    # This run writes 6 and 8 of its own line; keep=2 prunes X itself.
    save(tmp_path, cfg, parts, (6, 8), line=line, keep=2)
    assert not x.exists() and [p.name for p in store.list_checkpoints(tmp_path)] == ["step_0000006", "step_0000008"]
    # The requeue runs the same command: no error for the pruned X, the line's newest, nothing moved.
    resume.check_requested(tmp_path, x)
    chosen, again = resume.choose(tmp_path, x, parts[0], cfg)
    assert chosen == tmp_path / "checkpoints" / "step_0000008" and again == line
    assert abandoned(tmp_path) == [aside]
    # An automatic resume (no --resume) keeps writing the same line.
    assert resume.choose(tmp_path, None, parts[0], cfg) == (chosen, line)


def test_a_line_checkpoint_that_fails_its_check_is_passed_over(tmp_path, cfg, parts):
    x = save(tmp_path, cfg, parts, (4,))[0]
    line = resume.line_of(x)
    newest = save(tmp_path, cfg, parts, (6, 8), line=line)
    (newest[1] / "__0_0.distcp").write_bytes(b"")
    assert resume.choose(tmp_path, x, parts[0], cfg) == (newest[0], line)


def test_a_resume_path_that_is_gone_and_started_no_line_here_is_an_error(tmp_path, cfg, parts):
    save(tmp_path, cfg, parts, (2,))
    with pytest.raises(UserError, match="does not exist"):
        resume.check_requested(tmp_path, tmp_path / "checkpoints" / "step_0000004")


def test_a_resume_from_another_workdir_is_continued_on_requeue(tmp_path, cfg, parts):
    other = save(tmp_path / "other", cfg, parts, (4,))[0]
    here = tmp_path / "here"
    copy, line = resume.choose(here, other, parts[0], cfg)
    assert copy == here / "checkpoints" / "step_0000004" and store.read_meta(copy)["line"] == line
    # A requeue before the first save: the copy is the line's newest; nothing moved aside.
    assert resume.choose(here, other, parts[0], cfg) == (copy, line) and abandoned(here) == []
