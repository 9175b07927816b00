"""srun vs colossalai run: the demo recipe on 2 processes sharing the same cores.

Question: Does ``srun`` start training as fast as ``colossalai run`` on the same cores?
Goal: srun within 10% of colossalai run (``srun_vs_colossalai`` or ``srun_vs_colossalai_cpu``).

Run (root, a local Slurm cluster; brings up the single-node one with scripts/slurm/local_cluster.sh
when none is up, and stops it again): ``python -m benchmarks.bench_launch [--quick]``. Writes
``benchmarks/results/launch.json``. Not in the suite of ``benchmarks.run`` (it needs root and Slurm; ``--only launch`` runs it).

Contenders, each ``train.py --config recipes/demo_digits.py`` for ``steps`` optimizer steps on one node:

- ``srun``: ``srun -N 1 -n 2`` as a user types it, with no OMP_NUM_THREADS and no --cpus-per-task
  (a user's first try): vitlarge.distributed.process sizes each task's pools to usable cores / tasks on the node.
- ``colossalai``: ``colossalai run --nproc_per_node 2`` (torchrun exports OMP_NUM_THREADS=1).
- ``srun_full_pools`` (not with ``--quick``): ``srun`` with OMP_NUM_THREADS set to the node's core count,
  which is what every task ran before vitlarge sized its pools (PyTorch's default pool is the physical
  cores). On a loaded 2-core machine one such run trained at ~7 images/s.

Images/s of a run is the median over its steps after the first two (startup is not training) of the
train records' ``images_per_s``; images per CPU-second divides the images of those steps by the CPU
time the workers spent in them (the steadier number on a shared machine). Each contender's figure is
the median over interleaved rounds. Goal: srun within 10% of colossalai run (either measure, as in
docs/PERFORMANCE.md).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import results, timing  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)
from vitlarge.distributed import launcher

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "scripts" / "slurm" / "local_cluster.sh"
GLOBAL_BATCH = 128  # recipes/demo_digits.py


def _env(**extra: str) -> dict:
    """The caller's environment as a user's shell has it, plus ``extra``."""
    # As a user's shell has it: benchmarks.harness set OMP_WAIT_POLICY for the in-process benchmarks, not for these.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _records(workdir: Path) -> list[dict]:
    path = workdir / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            pass
    return out


def _last_step(workdir: Path) -> int:
    return max((r["step"] for r in _records(workdir) if r["event"] == "train"), default=0)


def _workers_cpu(workdir: Path, seen: dict[int, float]) -> float:
    """CPU seconds of every train.py worker of this run (srun's tasks are not our descendants, so found
    by their command line), keeping the last value of a worker that has exited."""
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if (
            "train.py" in cmd
            and str(workdir) in cmd
            and not any(Path(c).name in ("srun", "colossalai", "torchrun") for c in cmd[:2])
        ):
            try:
                t = p.cpu_times()
                seen[p.pid] = t.user + t.system
            except psutil.Error:
                pass
    return sum(seen.values())


def _contender(cmd_prefix: list[str], env: dict, args: list[str], steps: int, tmp: Path, name: str):
    """One run: (images/s, images per CPU-second) over steps 3..steps. Wall: the median of the train
    records' ``images_per_s``. CPU: the workers' CPU time between the records of step 2 and of the last
    step, polled every 0.1 s (startup, the final evaluation and the export are not training)."""
    counter = iter(range(1000))

    def run() -> tuple[float, float]:
        workdir = tmp / f"{name}-{next(counter)}"
        cmd = [
            *cmd_prefix,
            "train.py",
            "--config",
            "recipes/demo_digits.py",
            "--data",
            "data/digits",
            "--workdir",
            str(workdir),
            *args,
        ]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen: dict[int, float] = {}
        cpu = {}
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            now = _workers_cpu(workdir, seen)
            step = _last_step(workdir)
            for mark in (2, steps):
                if step >= mark and mark not in cpu:
                    cpu[mark] = now
            time.sleep(0.1)
        _, err = proc.communicate(timeout=60)
        if proc.returncode != 0 or len(cpu) < 2:
            raise RuntimeError(f"{name} failed ({proc.returncode}): {err[-2000:]}")
        rates = [r["images_per_s"] for r in _records(workdir) if r["event"] == "train" and r["step"] > 2]
        images = (steps - 2) * GLOBAL_BATCH
        return statistics.median(rates), images / max(cpu[steps] - cpu[2], 1e-9)

    return run


def run(quick: bool = True, tiny: bool = False) -> dict:
    tiny = results.is_tiny(tiny)
    steps = 4 if tiny else 12 if quick else 24
    repeats = 1 if tiny else 3
    up = subprocess.run(
        [str(CLUSTER), "up"] if subprocess.run([str(CLUSTER), "status"], capture_output=True).returncode else ["true"],
        capture_output=True,
        text=True,
    )
    started = "local_cluster: started" in up.stderr
    if up.returncode != 0:
        raise RuntimeError(f"no Slurm cluster: {up.stderr.strip()}")
    cores = len(os.sched_getaffinity(0))
    args = [f"train.max_steps={steps}", "train.checkpoint_every_steps=1000", "train.eval_every_epochs=1000"]
    srun = ["srun", "-N", "1", "-n", "2", "-O", "--job-name=vitlarge-bench-launch", sys.executable]
    colossal = [
        f"{Path(sys.executable).parent}/colossalai",
        "run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(launcher.free_port()),
    ]
    try:
        with tempfile.TemporaryDirectory(prefix="vitlarge-bench-launch-") as d:
            tmp = Path(d)
            contenders = {
                "srun": _contender(srun, _env(), args, steps, tmp, "srun"),
                "colossalai": _contender(colossal, _env(), args, steps, tmp, "colossalai"),
            }
            if not quick:  # ~30x slower on a shared 2-core machine: minutes per run
                contenders["srun_full_pools"] = _contender(
                    srun, _env(OMP_NUM_THREADS=str(cores)), args, steps, tmp, "srun_full"
                )
            # timing.interleaved's rotation; its slots hold each run's images/s ("wall_s") and images per
            # CPU-second ("cpu_s") here.
            raw = timing.interleaved_wall_cpu(contenders, repeats)
    finally:
        if started:
            subprocess.run([str(CLUSTER), "down"], capture_output=True)
    images = {n: timing.summary(v["wall_s"], 1) for n, v in raw.items()}
    per_cpu = {n: timing.summary(v["cpu_s"], 2) for n, v in raw.items()}
    ratio = images["srun"]["median"] / images["colossalai"]["median"]
    ratio_cpu = per_cpu["srun"]["median"] / per_cpu["colossalai"]["median"]
    result = {
        "steps": steps,
        "repeats": repeats,
        "processes": 2,
        "cores": cores,
        "images_per_s": images,
        "images_per_cpu_s": per_cpu,
        "srun_vs_colossalai": round(ratio, 3),
        "srun_vs_colossalai_cpu": round(ratio_cpu, 3),
        "goal": "srun >= 0.9x colossalai run (wall or CPU)",
        "met": max(ratio, ratio_cpu) >= 0.9,
    }
    if not tiny:
        results.write_result("launch", result)
    return result


if __name__ == "__main__":
    results.cli(run, __doc__)
