"""SIGUSR1 and SIGTERM: checkpoint at the next optimizer-step boundary, exit 75, resume at the next step.

The runs are started the way ``srun`` starts them (two ``python train.py`` processes with Slurm's
variables, no launcher in between), so each worker's own exit status is visible: both must exit 75
(EX_TEMPFAIL, which a Slurm requeue script keys on). One sequence of three runs, shared by the tests:

1. SIGUSR1 to one rank only (the other learns it through the per-step all-reduce) -> 75;
2. the same command; SIGTERM to every worker, as Slurm does at preemption -> 75;
3. the same command again finishes, bitwise equal to the uninterrupted reference.

tests/e2e/test_train.py covers SIGTERM to one rank of a 2-rank run.
"""

from __future__ import annotations

import json
import signal

import pytest

from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.runs import (
    REFERENCE_STEPS,
    assert_bitwise_equal,
    final_weights,
    kill_all,
    metrics_has_step,
    reference_run,
    resumed_at,
    srun,
    train_args,
)

TIMEOUT = 600
EXIT_PREEMPTED = 75


def stopped_run(args, workdir, logs, wait_step: int, sig: int, targets: str) -> tuple[list[int], str]:
    """Starts the srun-style run, sends ``sig`` once ``wait_step`` is logged; returns exit codes and rank 0's log."""
    procs = srun(args, 2, logs)
    try:
        assert launcher.wait_for(metrics_has_step(workdir, wait_step), TIMEOUT, procs[0]), logs[0].read_text()[-3000:]
        for p in procs[1:] if targets == "one" else procs:
            p.send_signal(sig)
        codes = [p.wait(timeout=TIMEOUT) for p in procs]
    finally:
        kill_all(procs)
    return codes, logs[0].read_text()


@pytest.fixture(scope="module")
def preempted_sequence(demo_data, tmp_path_factory):
    ref = reference_run(demo_data, tmp_path_factory)
    tmp = tmp_path_factory.mktemp("signals")
    workdir = tmp / "run"
    args = train_args(demo_data, workdir)
    logs = lambda name: [tmp / f"{name}_rank{r}.log" for r in range(2)]  # noqa: E731

    usr1 = stopped_run(args, workdir, logs("usr1"), 3, signal.SIGUSR1, "one")
    usr1_ckpts = sorted(p.name for p in (workdir / "checkpoints").glob("step_*"))
    term = stopped_run(args, workdir, logs("term"), 8, signal.SIGTERM, "all")
    procs = srun(args, 2, logs("final"))
    try:
        final_codes = [p.wait(timeout=TIMEOUT) for p in procs]
    finally:
        kill_all(procs)
    return dict(
        ref=ref,
        workdir=workdir,
        usr1=usr1,
        usr1_ckpts=usr1_ckpts,
        term=term,
        final=(final_codes, logs("final")[0].read_text()),
    )


def stop_step(log: str) -> int:
    """The step named in "vitlarge: stopped on signal after step N; checkpoint ..." (rank 0)."""
    line = next(x for x in log.splitlines() if x.startswith("vitlarge: stopped on signal after step "))
    return int(line.split("after step ")[1].split(";")[0])


def test_sigusr1_to_one_rank_checkpoints_at_the_step_boundary_and_exits_75(preempted_sequence):
    codes, log = preempted_sequence["usr1"]
    assert codes == [EXIT_PREEMPTED, EXIT_PREEMPTED], log[-3000:]
    step = stop_step(log)
    assert 3 <= step < REFERENCE_STEPS
    assert f"step_{step:07d}" in preempted_sequence["usr1_ckpts"]  # complete, under its final name
    assert "Traceback" not in log


def test_sigterm_to_all_workers_checkpoints_and_exits_75(preempted_sequence):
    codes, log = preempted_sequence["term"]
    assert codes == [EXIT_PREEMPTED, EXIT_PREEMPTED], log[-3000:]
    first = stop_step(preempted_sequence["usr1"][1])
    assert resumed_at(log) == [(str(preempted_sequence["workdir"] / "checkpoints" / f"step_{first:07d}"), first)]
    assert 8 <= stop_step(log) < REFERENCE_STEPS
    assert "Traceback" not in log


def test_each_resumed_run_continues_at_checkpoint_step_plus_one(preempted_sequence):
    workdir = preempted_sequence["workdir"]
    codes, log = preempted_sequence["final"]
    assert codes == [0, 0], log[-3000:]
    stops = [stop_step(preempted_sequence[k][1]) for k in ("usr1", "term")]
    assert resumed_at(log) == [(str(workdir / "checkpoints" / f"step_{stops[1]:07d}"), stops[1])]

    # Raw file: each start record is at the checkpoint step, and the next train record is one later.
    raw = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    starts = [i for i, r in enumerate(raw) if r["event"] == "start"]
    assert [raw[i]["step"] for i in starts] == [0, *stops]
    for i in starts:
        first_train = next(r for r in raw[i:] if r["event"] == "train")
        assert first_train["step"] == raw[i]["step"] + 1
    ckpt_records = [r["step"] for r in raw if r["event"] == "checkpoint"]
    assert stops[0] in ckpt_records and stops[1] in ckpt_records

    train = [r for r in read_metrics(str(workdir / "metrics.jsonl")) if r["event"] == "train"]
    assert [r["step"] for r in train] == list(range(1, REFERENCE_STEPS + 1))  # contiguous after dedup
    assert_bitwise_equal(final_weights(preempted_sequence["ref"]), final_weights(workdir))
