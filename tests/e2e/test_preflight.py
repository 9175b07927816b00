"""One rank's bad input stops every rank within seconds, printed by the rank that met it.

Two train.py processes started as a launcher starts them (``RANK``/``WORLD_SIZE``/``MASTER_*``), one
per "node": rank 1's ``--data`` does not exist there (a mount missing on one node). Both exit 2
long before the 300 s rendezvous timeout; rank 1 prints the path with its rank and host, rank 0
prints one line naming rank 1. When every rank meets the same error, rank 0 alone prints it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from tests.helpers import launcher

ARGS = ["--config", "recipes/demo_digits.py", "train.max_steps=1"]


def start(rank: int, port: int, data: str, workdir) -> subprocess.Popen:
    env = launcher.env() | {
        "RANK": str(rank),
        "LOCAL_RANK": "0",  # one task per node
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    cmd = [sys.executable, "train.py", *ARGS, "--data", data, "--workdir", str(workdir)]
    return subprocess.Popen(cmd, cwd=launcher.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_pair(data: tuple[str, str], workdir) -> tuple[list, float]:
    port, t0 = launcher.free_port(), time.monotonic()
    procs = [start(r, port, data[r], workdir) for r in (0, 1)]
    try:
        out = [p.communicate(timeout=200) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, out)], time.monotonic() - t0


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_data_path_missing_on_one_node_stops_both_ranks_and_names_the_rank(demo_data, tmp_path):
    missing = str(tmp_path / "not_mounted_here")
    (rc0, _, err0), (rc1, _, err1) = run_pair((demo_data, missing), tmp_path / "run")[0]
    assert (rc0, rc1) == (2, 2), err0[-2000:] + err1[-2000:]
    host = socket.gethostname()
    (line1,) = errors(err1)
    assert line1.startswith(f"error: rank 1 on {host}: ") and missing in line1
    (line0,) = errors(err0)
    assert line0.startswith(f"error: rank 1 on {host} stopped the run: ") and missing in line0
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_an_error_every_rank_meets_is_printed_once_by_rank_0(tmp_path):
    missing = str(tmp_path / "nowhere")
    results, _ = run_pair((missing, missing), tmp_path / "run")
    assert [rc for rc, _, _ in results] == [2, 2]
    (line,) = errors(results[0][2])
    assert line.startswith(f"error: {missing}: ")  # as one process would say it: no rank, no host
    assert errors(results[1][2]) == []
