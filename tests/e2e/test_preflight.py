"""One rank's bad input stops every rank within seconds, printed by the rank that met it.

Two train.py processes with the variables a launcher sets (``RANK``/``WORLD_SIZE``/``MASTER_*``), one
per "node", forked from the session's pre-imported server (tests/helpers/forked.py): rank 1's ``--data`` does not exist there (a mount missing on one node). Both exit 2
long before the 300 s rendezvous timeout; rank 1 prints the path with its rank and host, rank 0
prints one line naming rank 1. When every rank meets the same error, rank 0 alone prints it.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path

from tests.helpers import launcher
from tests.helpers.forked import Rank

ARGS = ["--config", "recipes/demo_digits.py", "train.max_steps=1"]


def start(
    rank: int, port: int, data: str, workdir, args: list[str], logs: Path, delay_s: float = 0.0, extra_env=None
) -> Rank:
    env = (
        launcher.env()
        | (extra_env or {})
        | {
            "RANK": str(rank),
            "LOCAL_RANK": "0",  # one task per node
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    argv = ["train.py", *args, "--data", data, "--workdir", str(workdir)]
    return Rank(argv, env, launcher.ROOT, logs / f"rank{rank}.out", logs / f"rank{rank}.err", delay_s)


def run_pair(
    data: tuple[str, str],
    workdir,
    workdirs: tuple | None = None,
    args: tuple | None = None,
    delay0_s: float = 0.0,
    envs: tuple | None = None,
) -> tuple[list, float]:
    """Both ranks forked from the session's pre-imported server (tests/helpers/forked.py: the launcher is not the
    subject). ``workdirs``: each rank's own --workdir (a shared folder that is another one on one node); ``args``:
    each rank's own arguments before --data (a recipe present on one node only); ``delay0_s``: rank 0 starts this
    much later (a real rank spends it importing); ``envs``: variables each rank's environment adds."""
    logs = Path(tempfile.mkdtemp(prefix="preflight-"))
    port, t0 = launcher.free_port(), time.monotonic()
    procs = [
        start(
            r,
            port,
            data[r],
            (workdirs or (workdir, workdir))[r],
            (args or (ARGS, ARGS))[r],
            logs,
            (delay0_s, 0)[r],
            (envs or ({}, {}))[r],
        )
        for r in (0, 1)
    ]
    try:
        codes = [p.wait(timeout=200) for p in procs]
    finally:
        for p in procs:
            launcher.kill_tree(p)
    out = [((logs / f"rank{r}.out").read_text(), (logs / f"rank{r}.err").read_text()) for r in (0, 1)]
    shutil.rmtree(logs)
    return [(c, o, e) for c, (o, e) in zip(codes, out)], time.monotonic() - t0


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
    # rank 1 stops before the process group (train.py checks the data set before loading PyTorch) and tells rank 0
    assert line0.startswith(f"error: rank 1 on {host} stopped the run before the rendezvous: ") and missing in line0
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_an_error_every_rank_meets_is_printed_once_by_rank_0(tmp_path):
    missing = str(tmp_path / "nowhere")
    results, _ = run_pair((missing, missing), tmp_path / "run")
    assert [rc for rc, _, _ in results] == [2, 2]
    (line,) = errors(results[0][2])
    assert line.startswith(f"error: {missing}: ")  # as one process would say it: no rank, no host
    assert errors(results[1][2]) == []


def test_a_shard_missing_on_one_node_stops_both_ranks_before_the_first_step(demo_data, tmp_path):
    """Node-local copies of the data set, one of them incomplete: rank 1's copy lacks a training shard. The
    shard check is part of the agreed pre-flight, so both exit 2 with one line each, not a gloo traceback at
    the first step (or, on NCCL, rank 0 waiting out the collective timeout)."""
    import shutil

    partial = tmp_path / "partial_copy"
    shutil.copytree(demo_data, partial)
    shard = partial / "train-00003-of-00004"
    shard.unlink()
    (rc0, _, err0), (rc1, _, err1) = run_pair((demo_data, str(partial)), tmp_path / "run")[0]
    assert (rc0, rc1) == (2, 2), err0[-2000:] + err1[-2000:]
    assert "Traceback" not in err0 + err1, err0[-2000:] + err1[-2000:]
    host = socket.gethostname()
    (line1,) = errors(err1)
    assert line1.startswith(f"error: rank 1 on {host}: ") and shard.name in line1 and "missing" in line1
    (line0,) = errors(err0)
    assert line0.startswith(f"error: rank 1 on {host} stopped the run: ") and shard.name in line0
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_nodes_that_see_different_data_sets_are_refused_before_training(demo_data, tmp_path):
    """Every check passes on each node, but rank 1's node-local copy is another conversion (here: another
    checksum recorded for one shard). Each rank would plan and read its own data set; the run is refused
    before the first step with one line naming both ranks, hosts and what each sees."""
    import json
    import shutil

    other = tmp_path / "other_conversion"
    shutil.copytree(demo_data, other)
    manifest = json.loads((other / "dataset.json").read_text())
    manifest["splits"]["train"]["shards"][0]["checksum"] = "crc32c:00000000"
    (other / "dataset.json").write_text(json.dumps(manifest))
    (rc0, _, err0), (rc1, _, err1) = run_pair((demo_data, str(other)), tmp_path / "run")[0]
    assert (rc0, rc1) == (2, 2), err0[-2000:] + err1[-2000:]
    (line,) = errors(err0)
    host = socket.gethostname()
    assert line.startswith("error: the ranks see different data sets") and f"rank 1 on {host}" in line
    assert "every node must see the same --data" in line
    assert errors(err1) == []  # printed once
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_workdir_that_is_another_folder_on_one_node_is_refused_before_training(demo_data, tmp_path):
    """The shared workdir is not mounted on rank 1's node: there the same path is a local folder (here: another
    path). Both pass their own writability check; rank 0's probe file is not in rank 1's view, so the run stops
    before the first step (not at the first checkpoint, in a collective mismatch), rank 1 naming itself."""
    shared, local = tmp_path / "shared", tmp_path / "node1_local"
    (rc0, _, err0), (rc1, _, err1) = run_pair((demo_data, demo_data), shared, (shared, local))[0]
    assert (rc0, rc1) == (2, 2), err0[-2000:] + err1[-2000:]
    host = socket.gethostname()
    (line1,) = errors(err1)
    assert line1.startswith(f"error: rank 1 on {host}: --workdir {local} here is not the folder rank 0 writes to")
    (line0,) = errors(err0)
    assert line0.startswith(f"error: rank 1 on {host} stopped the run: ")
    assert not (shared / "checkpoints").exists() and not (local / "checkpoints").exists()


def test_a_recipe_missing_on_one_node_stops_both_ranks_before_the_rendezvous_times_out(demo_data, tmp_path):
    """Before the process group exists: rank 1 cannot read its --config (a node-local checkout without it). It
    says so through the rendezvous store, naming itself; rank 0, waiting there, stops within a second and
    names rank 1 (it used to wait out the 300 s rendezvous and blame the network)."""
    missing = str(tmp_path / "recipes" / "demo_digits.py")
    args = (ARGS, ["--config", missing, *ARGS[2:]])
    # Rank 1 fails at once, 10 s before rank 0 (importing, in a real run) hosts the store it must report to.
    (results, elapsed) = run_pair((demo_data, demo_data), tmp_path / "run", args=args, delay0_s=10)
    (rc0, _, err0), (rc1, _, err1) = results
    assert (rc0, rc1) == (2, 2), err0[-2000:] + err1[-2000:]
    host = socket.gethostname()
    (line1,) = errors(err1)
    assert line1.startswith(f"error: rank 1 on {host}: ") and missing in line1
    (line0,) = errors(err0)
    assert line0.startswith(f"error: rank 1 on {host} stopped the run before the rendezvous: ") and missing in line0
    assert "Traceback" not in err0 + err1
    assert elapsed < 120, f"{elapsed:.0f}s: rank 0 waited for the rendezvous instead of hearing from rank 1"


def test_an_error_every_rank_meets_before_the_rendezvous_is_printed_once(demo_data, tmp_path):
    bad = [*ARGS, "train.no_such_key=1"]
    (results, _) = run_pair((demo_data, demo_data), tmp_path / "run", args=(bad, bad))
    (rc0, _, err0), (rc1, _, err1) = results
    assert (rc0, rc1) == (2, 2), err0[-2000:] + err1[-2000:]
    (line,) = errors(err0)
    assert "train.no_such_key" in line and "rank" not in line.split(":")[1]  # as one process would say it
    assert errors(err1) == []


def test_a_node_without_a_compiler_stops_a_compiled_run_before_the_rendezvous_times_out(tmp_path):
    """Issue 31 item 4: train.compile=on where rank 1's node has no g++ on PATH (no build-essential). Both exit 2
    before step 1, with one line naming the package, instead of Inductor's traceback at step 1."""
    bare = tmp_path / "bin"  # a PATH with no compiler on it
    bare.mkdir()
    args = [*ARGS, "data.source=synthetic", "train.compile=on"]
    results, _ = run_pair(
        ("/nonexistent", "/nonexistent"), tmp_path / "run", args=(args, args), envs=({}, {"PATH": str(bare)})
    )
    (rc0, _, err0), (rc1, _, err1) = results
    assert (rc0, rc1) == (2, 2), err0[-2000:] + err1[-2000:]
    host = socket.gethostname()
    (line1,) = errors(err1)
    assert line1 == (
        f"error: rank 1 on {host}: train.compile=on, but g++ (Inductor's C++ compiler; set CXX for another) is not on "
        "PATH: install it (Debian/Ubuntu: apt install build-essential; RHEL: dnf install gcc-c++), or set "
        "train.compile=off to train eager"
    )
    (line0,) = errors(err0)
    assert line0.startswith(
        f"error: rank 1 on {host} stopped the run before the rendezvous: train.compile=on, but g++ "
    )
