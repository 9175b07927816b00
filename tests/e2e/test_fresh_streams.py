"""A resume at another world size continues with fresh data, never a replay of the run's start (issue 21, item 5).

Three real runs of the demo recipe (ranks forked with torchrun's variables, tests/helpers/forked.py) through tests/helpers/record_train.py, which records a hash of
every micro-batch each rank takes (images after the loader's augmentation, and labels): a 2-process run
stopped at step 4, its resume on 4 processes, and a fresh 4-process run. A resume that rebuilt the loader
with the run's first seed (what vitlarge did before) hands each rank exactly the fresh run's first
micro-batches; the stream is derived from (seed, phase, step) instead, so none of them repeat.
The loader-level rule is in tests/unit/data/test_fresh_streams.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.helpers import launcher
from tests.helpers.runs import RECIPE, resumed_at


def run(demo_data: str, workdir: Path, record: Path, nproc: int, steps: int):
    args = [
        "--config",
        RECIPE,
        "--data",
        demo_data,
        "--workdir",
        str(workdir),
        "train.checkpoint_every_steps=2",
        "train.log_every_steps=1",
        f"train.max_steps={steps}",
    ]
    r = launcher.run(args, nproc, script=("tests/helpers/record_train.py",), extra_env={"VITLARGE_RECORD": str(record)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def taken(record: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (record / f"rank_{rank}.jsonl").read_text().splitlines()]


def test_a_resume_on_more_processes_does_not_replay_the_runs_first_batches(demo_data, tmp_path):
    workdir = tmp_path / "run"
    run(demo_data, workdir, tmp_path / "first", 2, 4)
    r = run(demo_data, workdir, tmp_path / "resumed", 4, 6)
    assert [step for _, step in resumed_at(r.stdout + r.stderr)] == [4]
    run(demo_data, tmp_path / "fresh", tmp_path / "fresh_rec", 4, 2)

    accum = 2  # 128 = 16 x 2 x 4: two optimizer steps are 4 micro-batches per rank
    first_images = {b["images"] for rank in (0, 1) for b in taken(tmp_path / "first", rank)}
    for rank in range(4):
        resumed, fresh = taken(tmp_path / "resumed", rank), taken(tmp_path / "fresh_rec", rank)
        assert len(resumed) == 2 * accum and len(fresh) == 2 * accum, (len(resumed), len(fresh))
        assert {b["world"] for b in resumed} == {4}
        # Not the fresh 4-process run's stream (what a reseed with the first seed would give) ...
        assert [b["images"] for b in resumed] != [b["images"] for b in fresh]
        assert all(a["images"] != b["images"] for a, b in zip(resumed, fresh, strict=True)), rank
        assert [b["labels"] for b in resumed] != [b["labels"] for b in fresh]
        # ... nor any micro-batch the 2-process start took.
        assert not {b["images"] for b in resumed} & first_images
    assert os.path.isdir(workdir / "checkpoints" / "step_0000006")
