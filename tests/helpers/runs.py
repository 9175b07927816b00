"""Shared by the end-to-end tests that compare real train.py runs (tests/e2e/, tests/e2e/reliability/).

Here: the demo recipe's arguments, one uninterrupted two-rank reference run (built once per
session and reused by every module that compares final weights against it), bitwise comparison,
and an ``srun`` stand-in (two ``python train.py`` processes with Slurm's variables) for tests that
must see each worker's own exit status, as Slurm does.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import launcher
from tests.helpers.launcher import assert_bitwise_equal, final_weights  # noqa: F401 (re-exported for the tests here)

RECIPE = "recipes/demo_digits.py"
REFERENCE_STEPS = 12  # an epoch is 11 steps at global batch 128: every resumed run crosses an epoch boundary
RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")


def demo_args(data: str, workdir: Path, *extra: str) -> list[str]:
    """train.py's command line for the demo recipe on ``data`` into ``workdir``, a metrics.jsonl record per step;
    ``extra``: more overrides (or flags), last."""
    return ["--config", RECIPE, "--data", data, "--workdir", str(workdir), "train.log_every_steps=1", *extra]


def train_args(data: str, workdir: Path, *extra: str) -> list[str]:
    """The command line shared by the reference and every run compared with it (only --workdir differs)."""
    return demo_args(
        data,
        workdir,
        f"train.max_steps={REFERENCE_STEPS}",
        "train.checkpoint_every_steps=2",
        "train.keep_checkpoints=3",
        *extra,
    )


_reference: dict[str, Path] = {}


def reference_run(demo_data: str, tmp_path_factory) -> Path:
    """Workdir of one uninterrupted 2-rank run (forked ranks) of `train_args`; built once per session."""
    if demo_data not in _reference:
        workdir = tmp_path_factory.mktemp("reliability_reference")
        r = launcher.run(train_args(demo_data, workdir), nproc=2)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        _reference[demo_data] = workdir
    return _reference[demo_data]


def assert_scaler_contract(train: list[dict], growth_interval: int) -> None:
    """What dynamic loss scaling guarantees, step by step, on a run's ``train`` records (any precision).

    A skipped step has a non-finite gradient norm and halves the scale for the next step; a scale
    grows (x2) only after ``growth_interval`` finite steps in a row, and otherwise stays. Without
    fp16 the scale is 1 and nothing is skipped unless the gradients were not finite.
    """
    import math

    finite_run = 0
    for prev, cur in zip(train, train[1:]):
        assert prev["skipped"] == (prev["grad_norm"] is None or not math.isfinite(prev["grad_norm"])), prev
        if prev["skipped"]:
            finite_run, expected = 0, prev["loss_scale"] / 2
        else:
            finite_run += 1
            grow = finite_run == growth_interval
            finite_run = 0 if grow else finite_run
            expected = prev["loss_scale"] * (2 if grow else 1)
        if prev["loss_scale"] == 1.0 and cur["loss_scale"] == 1.0:
            continue  # no scaler (bf16/fp32)
        assert cur["loss_scale"] == expected, (prev, cur)


def raw_metrics(workdir: Path) -> list[dict]:
    """Raw metrics.jsonl records in file order (every attempt), skipping a partial last line (a run still writing)."""
    import json

    path = Path(workdir) / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def checkpoint_steps(workdir: Path) -> list[int]:
    """Steps of the complete checkpoints (final names) under ``workdir``, oldest first."""
    from vitlarge.checkpoint.trust import layout

    return [int(p.name[5:]) for p in layout.list_checkpoints(workdir)]


def resumed_at(log: str) -> list[tuple[str, int]]:
    return [(path, int(step)) for path, step in RESUMED.findall(log)]


def srun(
    args: list[str],
    ntasks: int,
    logs: list[Path],
    wrap: dict[int, list[str]] | None = None,
    script: tuple = ("train.py",),
    fork: bool | None = None,
) -> list:
    """Starts ``python train.py`` ``ntasks`` times with the variables srun sets (no launcher in between).

    ``wrap`` puts a command in front of some ranks' (e.g. ``unshare`` to give one rank its own view of files);
    ``script`` is the entry point and its arguments (tests/helpers/poison_train.py wraps train.py). The tasks
    are forked from the session's pre-imported server (`tests.helpers.forked.Rank`: ``poll``, ``wait``,
    ``returncode``, ``pid`` as `subprocess.Popen` has them) unless ``wrap`` is given or ``fork=False``."""
    fork = not wrap if fork is None else fork
    port = launcher.free_port()
    procs = []
    for rank, log in enumerate(logs[:ntasks]):
        env = launcher.env()
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(k, None)
        env.update(
            SLURM_PROCID=str(rank),
            SLURM_NTASKS=str(ntasks),
            SLURM_LOCALID=str(rank),
            SLURM_STEP_ID="0",
            SLURM_JOB_NODELIST="127.0.0.1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        if fork:
            from tests.helpers.forked import Rank

            Path(log).write_text("")
            procs.append(Rank([*script, *args], env, launcher.ROOT, Path(log)))
            continue
        cmd = [*(wrap or {}).get(rank, []), sys.executable, *script, *args]
        procs.append(
            subprocess.Popen(
                cmd, cwd=launcher.ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True
            )
        )
    return procs


def metrics_has_step(workdir: Path, step: int):
    """A predicate for `launcher.wait_for`: metrics.jsonl holds the train record of ``step``."""
    path = workdir / "metrics.jsonl"
    needle = f'"event": "train", "step": {step},'

    def seen() -> bool:
        return path.exists() and needle in path.read_text()

    return seen


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        launcher.kill_tree(p.pid)
    for p in procs:
        p.wait(timeout=60)
