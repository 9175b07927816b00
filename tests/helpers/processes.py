"""What every process a test starts shares: its environment (`env`) and its end (`kill_tree`), for
`tests.helpers.launcher` (train.py as users start it) and `tests.helpers.forked` (ranks forked from a pre-imported
parent) alike, so neither imports the other for them."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import torch

VENV_BIN = str(Path(sys.executable).parent)


# A test that joins a process group in the pytest process leaves these set (init_distributed exports
# them, as torchrun would): a child started afterwards must get its launcher's, not that dead rendezvous.
LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def env() -> dict:
    """The environment every run a test starts gets: this one's without a launcher's variables and, where this
    process sees no CUDA device, with none said to the runs either (``CUDA_VISIBLE_DEVICES`` empty, Slurm's GPU
    variables dropped): a shell profile's CUDA_VISIBLE_DEVICES would otherwise stop every CPU run with
    train.device=auto (`vitlarge.distributed.process.gpus_asked_for`), and an empty one that hides a machine's
    GPUs from the suite must hide them from its runs too."""
    from vitlarge.distributed.process import GPU_VARIABLES

    drop = LAUNCHER_VARIABLES + (() if torch.cuda.is_available() else GPU_VARIABLES)
    e = {k: v for k, v in os.environ.items() if k not in drop}
    if not torch.cuda.is_available():
        e["CUDA_VISIBLE_DEVICES"] = ""
    e["PATH"] = VENV_BIN + os.pathsep + e.get("PATH", "")  # colossalai run looks torchrun up on PATH
    e["OMP_NUM_THREADS"] = "1"
    e["PYTHONUNBUFFERED"] = "1"
    return e


def kill_tree(pid, sig: int = signal.SIGKILL) -> None:
    """Signals a process and everything under it, all at once, then waits for them. ``pid``: a pid, a
    `subprocess.Popen`, or a forked `tests.helpers.forked.Job` (each of its ranks and what they started)."""
    procs = []
    # A job's ranks that have ended (and been reaped: their pids may be reused) are left out.
    roots = [r.pid for r in pid.ranks if r.poll() is None] if hasattr(pid, "ranks") else [getattr(pid, "pid", pid)]
    for root in roots:
        try:
            parent = psutil.Process(root)
            procs += parent.children(recursive=True) + [parent]
        except psutil.NoSuchProcess:
            continue
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)
