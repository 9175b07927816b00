"""srun vs colossalai run: the demo recipe on 2 processes sharing the same cores (issue 16).

Run (root, a local Slurm cluster; brings up the single-node one with scripts/slurm/local_cluster.sh
when none is up, and stops it again): ``python -m benchmarks.bench_launch [--quick]``. Writes
``benchmarks/results/launch.json``. Not part of ``benchmarks.run`` (it needs root and Slurm).

Contenders, each ``train.py --config recipes/demo_digits.py`` for ``steps`` optimizer steps on one node:

- ``srun``: ``srun -N 1 -n 2`` as a user types it, with no OMP_NUM_THREADS and no --cpus-per-task
  (the issue's case): vitlarge.launch sizes each task's pools to usable cores / tasks on the node.
- ``colossalai``: ``colossalai run --nproc_per_node 2`` (torchrun exports OMP_NUM_THREADS=1).
- ``srun_full_pools`` (not with ``--quick``): ``srun`` with OMP_NUM_THREADS set to the node's core count,
  which is what every task ran before vitlarge sized its pools (PyTorch's default pool is the physical
  cores). On the loaded 2-core machine of issue 16 one such run trained at ~7 images/s.

Images/s of a run is the median over its steps after the first two (startup is not training) of the
train records' ``images_per_s``; each contender's figure is the median over interleaved rounds.
Goal: srun within 10% of colossalai run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import common  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)
from vitlarge import launch

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "scripts" / "slurm" / "local_cluster.sh"


def _env(**extra: str) -> dict:
    # As a user's shell has it: common.py set OMP_WAIT_POLICY for the in-process benchmarks, not for these.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _images_per_s(workdir: Path) -> float:
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rates = [r["images_per_s"] for r in records if r["event"] == "train" and r["step"] > 2]
    return statistics.median(rates)


def _contender(cmd_prefix: list[str], env: dict, args: list[str], tmp: Path, name: str):
    counter = iter(range(1000))

    def run() -> tuple[float, float]:
        workdir = tmp / f"{name}-{next(counter)}"
        cmd = [*cmd_prefix, "train.py", "--config", "recipes/demo_digits.py", "--data", "data/digits",
               "--workdir", str(workdir), *args]
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"{name} failed ({r.returncode}): {r.stderr[-2000:]}")
        return _images_per_s(workdir), 0.0

    return run


def run(quick: bool = True, tiny: bool = False) -> dict:
    tiny = common.is_tiny(tiny)
    steps = 4 if tiny else 12 if quick else 24
    repeats = 1 if tiny else 3
    up = subprocess.run([str(CLUSTER), "up"] if subprocess.run([str(CLUSTER), "status"], capture_output=True)
                        .returncode else ["true"], capture_output=True, text=True)
    started = "local_cluster: started" in up.stderr
    if up.returncode != 0:
        raise RuntimeError(f"no Slurm cluster: {up.stderr.strip()}")
    cores = len(os.sched_getaffinity(0))
    args = [f"train.max_steps={steps}", "train.checkpoint_every_steps=1000", "train.eval_every_epochs=1000"]
    srun = ["srun", "-N", "1", "-n", "2", "-O", "--job-name=vitlarge-bench-launch", sys.executable]
    colossal = [f"{Path(sys.executable).parent}/colossalai", "run", "--nproc_per_node", "2", "--master_port",
                str(launch._free_port())]
    try:
        with tempfile.TemporaryDirectory(prefix="vitlarge-bench-launch-") as d:
            tmp = Path(d)
            contenders = {
                "srun": _contender(srun, _env(), args, tmp, "srun"),
                "colossalai": _contender(colossal, _env(), args, tmp, "colossalai"),
            }
            if not quick:  # ~30x slower on a shared 2-core machine: minutes per run
                contenders["srun_full_pools"] = _contender(srun, _env(OMP_NUM_THREADS=str(cores)), args, tmp, "srun_full")
            # common.interleaved's rotation; its first slot ("wall_s") holds each run's images/s here.
            raw = common.interleaved(contenders, repeats)
    finally:
        if started:
            subprocess.run([str(CLUSTER), "down"], capture_output=True)
    images = {n: common.summary(v["wall_s"], 1) for n, v in raw.items()}
    ratio = images["srun"]["median"] / images["colossalai"]["median"]
    result = {"steps": steps, "repeats": repeats, "processes": 2, "cores": cores, "images_per_s": images,
              "srun_vs_colossalai": round(ratio, 3), "goal": "srun >= 0.9x colossalai run", "met": ratio >= 0.9}
    if not tiny:
        common.write_result("launch", result)
    return result


if __name__ == "__main__":
    common.cli(run, __doc__)
