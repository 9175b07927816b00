"""A recipe trained by ``colossalai run`` as users start it (2 CPU processes), for the benchmarks that train whole
schedules (bench_progressive, bench_rect_val)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
VENV_BIN = str(Path(sys.executable).parent)


def train(recipe: str, workdir: Path, *extra: str, port: int | None = None) -> dict:
    """``colossalai run --nproc_per_node 2 train.py --config recipe --workdir workdir extra...`` (OMP_NUM_THREADS=1,
    ``--master_port port``, default 29500 + this process's id mod 1000); its wall time, training time (the sum of
    the step times in metrics.jsonl), final top-1 and every evaluation as (epoch, top-1, training seconds)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    cmd = [
        f"{VENV_BIN}/colossalai",
        "run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port or 29500 + os.getpid() % 1000),
        "train.py",
        "--config",
        recipe,
        "--workdir",
        str(workdir),
        *extra,
    ]
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [x for x in records if x["event"] == "train"]
    evals = [x for x in records if x["event"] == "eval"]
    spent = {}  # training seconds done at each step
    for x in steps:
        spent[x["step"]] = spent.get(x["step"] - 1, 0.0) + x["step_time"]
    return dict(
        recipe=recipe,
        wall_s=round(wall, 1),
        train_s=round(spent[steps[-1]["step"]], 1),
        top1=evals[-1]["val_top1"],
        evals=[(round(x["epoch"], 2), x["val_top1"], round(spent[x["step"]], 1)) for x in evals],
        started=time.strftime("%H:%M:%S", time.gmtime(t0)),
    )
