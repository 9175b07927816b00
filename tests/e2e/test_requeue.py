"""A run started with ``--resume step_4``, stopped by SIGUSR1 twice and run again with the same command
each time (what Slurm's requeue does), ends at its last step with no second ``abandoned_*`` folder:
each rerun continues the line that started at step 4 (tests/unit/checkpoint/test_resume.py has the rule).
"""

import signal

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.runs import kill_all, metrics_has_step, resumed_at, srun


def abandoned(workdir):
    return sorted((workdir / "checkpoints").glob("abandoned_*"))


def tensorboard_steps(workdir) -> set[int]:
    acc = EventAccumulator(str(workdir / "tb"))
    acc.Reload()
    return {e.step for e in acc.Scalars("train/loss")}


def test_requeues_of_a_run_started_with_resume_finish_it(demo_data, tmp_path):
    base = ["--config", "recipes/demo_digits.py", "--data", demo_data, "--workdir", str(tmp_path)]
    base += ["train.checkpoint_every_steps=2", "train.keep_checkpoints=2", "train.log_every_steps=1"]
    r = launcher.run([*base, "train.max_steps=6"], nproc=2)
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
        # Exit 75 leaves with os._exit (launch.leave): TensorBoard was flushed and closed before, every step is there.
        logged = {m["step"] for m in read_metrics(str(tmp_path / "metrics.jsonl")) if m["event"] == "train"}
        assert tensorboard_steps(tmp_path) == logged and max(logged) >= stop_after
        if stop_after == 9:  # the requeue after the first stop continued the line, it did not go back
            assert resumed_at(logs[0].read_text())[-1][1] >= 7
    assert len(abandoned(tmp_path)) == 1  # the first --resume went back once; the requeues moved nothing
    r = launcher.run(cmd, nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert resumed_at(r.stdout + r.stderr)[-1][1] >= 9
    steps = [m["step"] for m in read_metrics(str(tmp_path / "metrics.jsonl")) if m["event"] == "train"]
    assert steps[-1] == 12 and len(abandoned(tmp_path)) == 1
