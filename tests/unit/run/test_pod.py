"""``python -m vitlarge.run.pod`` and the rendezvous it reads (`vitlarge.distributed.launcher.pod_rendezvous`), in
process. The variables each controller sets come from tests/helpers/controllers.py (its docstring cites their
source); a pod of scripts/k8s/ running for real: tests/e2e/test_k8s.py."""

from __future__ import annotations

import pytest

from tests.helpers import call_main
from vitlarge.distributed.launcher import pod_rendezvous
from vitlarge.errors import UserError

TRAINER = {  # Kubeflow Trainer's torch runtime, pod 1 of a TrainJob "vit" of 2 nodes x 8 GPUs
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "8",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "vit-node-0-0.vit",
    "PET_MASTER_PORT": "29500",
}
OLD_PYTORCHJOB = {"MASTER_ADDR": "vit-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}


def test_the_torch_runtimes_variables_become_torchruns_options():
    r = pod_rendezvous(TRAINER)
    assert r.torchrun_args() == [
        "--nnodes=2",
        "--node_rank=1",
        "--nproc_per_node=8",
        "--master_addr=vit-node-0-0.vit",
        "--master_port=29500",
    ]
    assert r.source == "PET_*"


def test_pet_variables_win_over_the_pyTorchJobs_per_pod_world_size_and_rank():
    # the operator from 1.8 sets both; WORLD_SIZE there counts processes (pods x nprocPerNode), RANK the pod
    env = {**TRAINER, "WORLD_SIZE": "16", "RANK": "1", "MASTER_ADDR": "x", "MASTER_PORT": "1"}
    r = pod_rendezvous(env)
    assert (r.nnodes, r.node_rank, r.nproc_per_node, r.master_addr) == (2, 1, "8", "vit-node-0-0.vit")


def test_an_older_pytorchjob_gives_one_process_per_pod():
    r = pod_rendezvous(OLD_PYTORCHJOB)
    assert (r.nnodes, r.node_rank, r.nproc_per_node, r.master_addr, r.master_port) == (3, 2, "1", "vit-master-0", 23456)
    assert r.source == "MASTER_*"


def test_nproc_per_node_auto_is_left_to_torchrun():
    env = {**TRAINER, "PET_NPROC_PER_NODE": "auto"}
    assert "--nproc_per_node=auto" in pod_rendezvous(env).torchrun_args()
    del env["PET_NPROC_PER_NODE"]
    assert pod_rendezvous(env).nproc_per_node == "1"


@pytest.mark.parametrize(
    "env,message",
    [
        ({}, "this pod has no rendezvous from a training controller"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, "this pod has no rendezvous from a training controller"),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "0"}, "but not PET_MASTER_ADDR, PET_MASTER_PORT"),
        ({**TRAINER, "PET_NODE_RANK": "2"}, "inconsistent controller variables (PET_*): pod 2 of 2"),
        ({**TRAINER, "PET_NNODES": "1:4"}, "PET_NNODES='1:4' is not an integer"),
    ],
)
def test_a_pod_without_its_controllers_variables_is_one_line(env, message):
    with pytest.raises(UserError, match=None) as e:
        pod_rendezvous(env)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_command_says_it_in_one_line_and_exits_2_before_torch_is_needed(monkeypatch):
    for key in ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", *OLD_PYTORCHJOB):
        monkeypatch.delenv(key, raising=False)
    r = call_main("vitlarge.run.pod", "train.py", "--config", "recipes/demo_digits.py")
    assert r.returncode == 2
    assert r.stderr.startswith("error: this pod has no rendezvous from a training controller (neither PET_NNODES")
    assert r.stderr.count("\n") == 1 and "scripts/k8s/trainjob.yaml" in r.stderr
