"""A requeue replays ``--resume X``: the run continues the line that started at X, moves nothing aside
and never rolls back, also after X itself was pruned.

In one process with real checkpoints (`resume.choose` as rank 0 runs it), then through train.py: a
two-rank run started with ``--resume step_4``, stopped by SIGUSR1 twice and run again with the same
command each time (what Slurm's requeue does), ends at the recipe's last step with no second
``abandoned_*`` folder.
"""

import signal
from pathlib import Path

import pytest
import torch

from hooks.jsonl import read_metrics
from tests import launcher
from tests.reliability import kill_all, metrics_has_step, resumed_at, srun
from vitlarge.checkpoint import resume, store
from vitlarge.config.load import load_recipe
from vitlarge.errors import UserError
from vitlarge.model.vit import build_model
from vitlarge.optim.lamb import build_optimizer

ROOT = Path(__file__).resolve().parent.parent
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


@pytest.mark.slow
def test_requeues_of_a_run_started_with_resume_finish_it(demo_data, tmp_path):
    base = ["--config", "recipes/demo_digits.py", "--data", demo_data, "--workdir", str(tmp_path)]
    base += ["train.checkpoint_every_steps=2", "train.keep_checkpoints=2", "train.log_every_steps=1"]
    r = launcher.run([*base, "train.max_steps=6"], nproc=2, launcher="torchrun")
    assert r.returncode == 0, r.stderr[-3000:]
    x = tmp_path / "checkpoints" / "step_0000004"
    cmd = [*base, "train.max_steps=12", "--resume", str(x)]
    for stop_after in (7, 9):  # SIGUSR1 once these steps are logged; each rerun is the same command
        logs = [tmp_path / f"stop_{stop_after}_rank{r}.log" for r in range(2)]
        procs = srun(cmd, 2, logs)
        try:
            assert launcher.wait_for(metrics_has_step(tmp_path, stop_after), 600, procs[0]), logs[0].read_text()[-3000:]
            for proc in procs:
                proc.send_signal(signal.SIGUSR1)
            assert [proc.wait(timeout=300) for proc in procs] == [75, 75], logs[0].read_text()[-3000:]
        finally:
            kill_all(procs)
        if stop_after == 9:  # the requeue after the first stop continued the line, it did not go back
            assert resumed_at(logs[0].read_text())[-1][1] >= 7
    assert len(abandoned(tmp_path)) == 1  # the first --resume went back once; the requeues moved nothing
    r = launcher.run(cmd, nproc=2, launcher="torchrun")
    assert r.returncode == 0, r.stderr[-3000:]
    assert resumed_at(r.stdout + r.stderr)[-1][1] >= 9
    steps = [m["step"] for m in read_metrics(str(tmp_path / "metrics.jsonl")) if m["event"] == "train"]
    assert steps[-1] == 12 and len(abandoned(tmp_path)) == 1
