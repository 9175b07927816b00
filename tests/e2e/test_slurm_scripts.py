"""scripts/slurm/requeue.sh's `srun_step`: the job step's shape from the nodes the job holds now.

Bash runs the real function with Slurm's variables set and a stand-in `srun` first on PATH that prints its
arguments (the step is `exec srun ...`, so a shell function could not stand in). The jobs themselves run on
the local cluster in tests/e2e/test_slurm*.py.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers import ROOT


def srun_step(tmp_path, per_node: str, nodes: int, divides: str | None = None) -> subprocess.CompletedProcess:
    stub = tmp_path / "bin" / "srun"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text('#!/bin/sh\necho "srun $*"\n')
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "VITLARGE_"))}
    env |= {"PATH": f"{stub.parent}:{env['PATH']}", "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_CPUS_PER_TASK": "8"}
    if divides is not None:
        env["VITLARGE_WORLD_DIVIDES"] = divides
    script = f'source scripts/slurm/requeue.sh; srun_step "{per_node}" python train.py --config x'
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    "per_node, held, divides, used",
    [
        ("8", 16, "128", 16),  # every node: 128 tasks
        ("8", 12, "128", 8),  # 96 does not divide 128: 8 of the 12 nodes
        ("8", 3, "128", 2),
        ("8", 12, None, 12),  # no rule: all of them (train.py checks)
        ("2", 1, "8", 1),
    ],
)
def test_the_step_uses_the_most_nodes_whose_world_divides(tmp_path, per_node, held, divides, used):
    r = srun_step(tmp_path, per_node, held, divides)
    assert r.returncode == 0, r.stderr
    n = int(per_node)
    expected = (
        f"srun --nodes={used} --ntasks={used * n} --ntasks-per-node={n} --cpus-per-task=8 python train.py --config x"
    )
    assert r.stdout.strip() == expected
    assert ("using" in r.stderr) == (used < held)
    if used < held:
        assert f"using {used} of the {held} nodes held: {used * n} tasks divide" in r.stderr


def test_no_node_count_divides_starts_all_and_says_so(tmp_path):
    r = srun_step(tmp_path, "6", 4, "128")  # 6, 12, 18, 24 tasks: none divides 128
    assert r.returncode == 0 and "--nodes=4 --ntasks=24 " in r.stdout
    assert "no count of up to 4 nodes x 6 tasks divides VITLARGE_WORLD_DIVIDES=128" in r.stderr


@pytest.mark.parametrize("per_node", ["0", "", "a100:4"])
def test_a_bad_tasks_per_node_is_one_line_and_no_step(tmp_path, per_node):
    r = srun_step(tmp_path, per_node, 2, "128")
    assert r.returncode == 2 and r.stdout == ""
    assert f"tasks per node must be a positive number, got '{per_node}'" in r.stderr
