"""Losing a node under torchrun's elastic launch: ``--nnodes=1:2``, two agents on this machine's loopback.

Each agent stands for a node with two workers (world 4). The second "node" fails: kill -9 of its agent
and workers together. The first agent's workers see the broken ring and exit; the agent restarts its
workers (``--max-restarts``) in a new rendezvous round that completes without the lost node (one node
is the minimum), and train.py resumes from the newest checkpoint at world 2: same global batch,
accumulation re-derived, one line saying so, the same last step and the planned lr at every step.
The Slurm version of the same (a node range, a real node failure, a requeue) is in
tests/e2e/test_slurm_multinode.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, launcher
from tests.helpers.runs import RECIPE
from tests.helpers.runs import raw_metrics as records

STEPS = 30


def agent(node: int, endpoint: str, args: list[str], log: Path) -> subprocess.Popen:
    """One torchrun agent ("node"), 2 workers, in its own session (kill_tree collects the workers)."""
    cmd = [
        f"{launcher.VENV_BIN}/torchrun",
        "--nnodes=1:2",
        "--nproc-per-node=2",
        "--max-restarts=3",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        "--rdzv-id=vitlarge-elastic-test",
        # The first agent hosts the rendezvous store; a round waits 5 s for a second node once one is there.
        f"--rdzv-conf=is_host={'true' if node == 0 else 'false'},last_call_timeout=5",
        "--monitor-interval=1",
        "train.py",
        *args,
    ]
    out = open(log, "w")
    return subprocess.Popen(
        cmd, cwd=ROOT, env=launcher.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def test_torchrun_node_range_loses_a_node_and_continues_on_the_one_left(demo_data, tmp_path):
    from vitlarge.config.load import load_config
    from vitlarge.plan.plan import make_plan

    settings = ("train.log_every_steps=1", f"train.max_steps={STEPS}", "train.checkpoint_every_steps=2")
    workdir = tmp_path / "run"
    args = ["--config", RECIPE, "--data", demo_data, "--workdir", str(workdir), *settings]
    endpoint = f"127.0.0.1:{launcher.free_port()}"
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    nodes = [agent(0, endpoint, args, logs[0])]
    time.sleep(1)  # the store first
    nodes.append(agent(1, endpoint, args, logs[1]))

    def progress_on_four() -> bool:
        starts = [r for r in records(workdir) if r["event"] == "start"]
        trained = [r["step"] for r in records(workdir) if r["event"] == "train"]
        return bool(starts) and starts[-1]["world_size"] == 4 and max(trained, default=0) >= starts[-1]["step"] + 5

    try:
        assert launcher.wait_for(progress_on_four, 300, nodes[0]), logs[0].read_text()[-3000:]
        launcher.kill_tree(nodes[1].pid)  # node 1 is gone: its agent and both workers, at once
        rc = nodes[0].wait(timeout=400)
    finally:
        for p in nodes:
            launcher.kill_tree(p.pid)
    text = logs[0].read_text()
    assert rc == 0, text[-4000:]

    recs = records(workdir)
    starts = [r for r in recs if r["event"] == "start"]
    assert (starts[-1]["world_size"], starts[-1]["accum_steps"], starts[-1]["global_batch"]) == (2, 4, 128), starts
    assert any((s["world_size"], s["accum_steps"]) == (4, 2) for s in starts[:-1]), starts
    resumed = starts[-1]["step"]
    assert resumed >= 2 and resumed % 2 == 0, starts
    assert (
        f"warning: {workdir / 'checkpoints'}/step_{resumed:07d} was written by 4 processes, this run has 2: weights, "
        "optimizer (re-sharded), step and lr schedule resume exactly, the global batch stays 128 (4 micro-steps "
        "per step now)"
    ) in text, text[-4000:]
    last_run = recs[recs.index(starts[-1]) :]
    assert [r["step"] for r in last_run if r["event"] == "train"] == list(range(resumed + 1, STEPS + 1))
    cfg = load_config(ROOT / RECIPE, [f"data.path={demo_data}", *settings])
    n = json.loads((Path(demo_data) / "dataset.json").read_text())["splits"]["train"]["num_examples"]
    plan = make_plan(cfg, 2, n)
    lrs = {r["step"]: r["lr"] for r in recs if r["event"] == "train"}
    # record "step": s is the s-th optimizer step, taken at the lr of step index s - 1
    assert all(lrs[s] == pytest.approx(plan.lr_at(cfg, s - 1), rel=1e-9) for s in lrs), lrs
    assert [r["step"] for r in recs if r["event"] == "checkpoint"][-1] == STEPS
    assert (workdir / "model" / "model.safetensors").is_file()
