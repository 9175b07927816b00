"""``python -m vitlarge.run.pod`` and the rendezvous it reads (`vitlarge.distributed.launcher.pod_rendezvous`), in
process. The variables each controller sets come from tests/helpers/controllers.py (its docstring cites their
source); a pod of scripts/k8s/ running for real: tests/e2e/test_k8s.py."""

from __future__ import annotations

import sys

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
        ({**TRAINER, "PET_NNODES": "1:4"}, "elastic PyTorchJobs are not supported; set replicas and no elasticPolicy"),
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


POD_VARIABLES = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NPROC_PER_NODE")
ONE_POD = {"PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "23456"}


@pytest.fixture
def pod_env(monkeypatch):
    """This process's environment without any controller's variables; the test sets the ones it needs."""
    for key in (*POD_VARIABLES, *OLD_PYTORCHJOB):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("PET_MASTER_PORT", "99999", "PET_MASTER_PORT='99999' is not a port (1..65535)"),
        ("PET_MASTER_PORT", "0", "PET_MASTER_PORT='0' is not a port (1..65535)"),
        ("PET_MASTER_PORT", "-5", "PET_MASTER_PORT='-5' is not a port (1..65535)"),
        ("PET_MASTER_ADDR", "", "PET_MASTER_ADDR='' is not a host name or an IP address"),
        ("PET_MASTER_ADDR", "a b;touch /tmp/x", "PET_MASTER_ADDR='a b;touch /tmp/x' is not a host name or an IP"),
        ("PET_MASTER_ADDR", "host:1", "PET_MASTER_ADDR='host:1' is not a host name or an IP address"),
        ("PET_MASTER_ADDR", "-x.example", "PET_MASTER_ADDR='-x.example' is not a host name or an IP address"),
        ("PET_MASTER_ADDR", "a" * 300, "PET_MASTER_ADDR='aaaaaaaa"),
        ("PET_NPROC_PER_NODE", "abc", "PET_NPROC_PER_NODE='abc' must be a count of processes 1..1024 or one of auto"),
        ("PET_NPROC_PER_NODE", "0", "PET_NPROC_PER_NODE='0' must be a count of processes"),
        ("PET_NPROC_PER_NODE", "-3", "PET_NPROC_PER_NODE='-3' must be a count of processes"),
        ("PET_NPROC_PER_NODE", "99999", "PET_NPROC_PER_NODE='99999' must be a count of processes"),
        (
            "PET_NNODES",
            "99999999999999999999999",
            "PET_NNODES='99999999999999999999999' must be a count of pods 1..65,536",
        ),
        ("PET_NNODES", "0", "PET_NNODES='0' must be a count of pods"),
        ("PET_NNODES", "1:4", "PET_NNODES='1:4' is a range of nodes (an elastic PyTorchJob): elastic PyTorchJobs are"),
        ("PET_NNODES", "9" * 5000, f"PET_NNODES='{'9' * 40}' is not an integer"),  # past int()'s digit limit
    ],
)
def test_a_value_torchrun_would_refuse_is_one_line_and_exit_2_before_torch(pod_env, key, value, message):
    """Each used to be a 20-40 line traceback from torchrun with exit 1; nothing here needs torch (the supervisor,
    which imports it, is made unimportable), and no value is ever given to a shell."""
    for k, v in {**ONE_POD, key: value}.items():
        pod_env.setenv(k, v)
    pod_env.setitem(sys.modules, "vitlarge.run.supervisor", None)  # importing it now raises
    r = call_main("vitlarge.run.pod", "train.py")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"error: environment variable {message}") and r.stderr.count("\n") == 1, r.stderr
    assert len(r.stderr) < 400


@pytest.mark.parametrize("addr", ["::1", "[::1]", "10.0.0.5", "vit-node-0-0.vit", "vit-master-0", "node_1.local."])
def test_an_ip_address_or_a_host_name_is_a_master(addr):
    r = pod_rendezvous({**ONE_POD, "PET_MASTER_ADDR": addr})
    assert r.master_addr == addr.strip("[]")


@pytest.mark.parametrize("key, value", [("MASTER_PORT", "70000"), ("WORLD_SIZE", "100000"), ("MASTER_ADDR", "a b")])
def test_an_older_pytorchjobs_variables_are_checked_alike(key, value):
    with pytest.raises(UserError, match=f"{key}='{value}'"):
        pod_rendezvous({**OLD_PYTORCHJOB, key: value})


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a host where CUDA sees no GPU")
def test_one_process_per_gpu_without_a_gpu_is_one_line(pod_env):
    for k, v in {**ONE_POD, "PET_NPROC_PER_NODE": "gpu"}.items():
        pod_env.setenv(k, v)
    r = call_main("vitlarge.run.pod", "train.py")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("error: PET_NPROC_PER_NODE='gpu' asks for one process per GPU, but CUDA sees no GPU")
