"""vitlarge/distributed/process.py: launcher detection from the environment, device choice, rendezvous errors."""

import contextlib
import os
import time

import pytest
import torch

from vitlarge.distributed import launcher
from vitlarge.distributed.launcher import DistEnv, detect, launcher_rank
from vitlarge.distributed.process import GPU_VARIABLES, choose_device, prints_error, rendezvous_timeout_s
from vitlarge.distributed.threads import thread_budget
from vitlarge.errors import EXIT_RENDEZVOUS, RendezvousFailed, UserError

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29511"}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "16",
    "SLURM_LOCALID": "1",
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "node01",
    "SLURM_STEP_ID": "0",
}  # srun sets SLURM_STEP_ID; a batch shell does not


def test_torchrun_variables():
    env = detect(dict(TORCHRUN))
    assert env == DistEnv(
        rank=3, world_size=8, local_rank=1, master_addr="10.0.0.5", master_port=29511, source="torchrun"
    )
    assert not env.is_main


def test_torchrun_defaults():
    env = detect({"RANK": "0", "WORLD_SIZE": "2"})
    assert (env.local_rank, env.master_addr, env.master_port, env.is_main) == (0, "127.0.0.1", 29500, True)


def test_slurm_variables():
    env = detect(dict(SLURM))
    assert env.source == "slurm"
    assert (env.rank, env.world_size, env.local_rank) == (5, 16, 1)
    assert env.master_addr == "node01"  # a single host is used as is, without scontrol
    assert env.master_port == 20000 + 123456 % 20000 == 23456


def test_slurm_port_is_the_same_on_every_rank_and_differs_between_jobs():
    ports = {detect({**SLURM, "SLURM_PROCID": str(r)}).master_port for r in range(16)}
    assert ports == {23456}
    assert detect({**SLURM, "SLURM_JOB_ID": "123457"}).master_port == 23457


def test_slurm_master_overrides():
    env = detect({**SLURM, "MASTER_PORT": "31000", "MASTER_ADDR": "head"})
    assert (env.master_addr, env.master_port) == ("head", 31000)


def test_slurm_without_job_id_or_localid():
    env = detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "gpu7"})
    assert (env.local_rank, env.master_port, env.master_addr) == (0, 20000, "gpu7")


def test_slurm_batch_shell_is_not_a_task():
    """sbatch's shell has SLURM_PROCID=0 and the job's SLURM_NTASKS but no SLURM_STEP_ID: only srun starts tasks."""
    batch = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"} | {"SLURM_PROCID": "0"}
    with pytest.raises(UserError, match="start train.py with srun"):
        detect(batch)
    assert detect({**batch, "SLURM_NTASKS": "1"}).world_size == 1  # a one-task job may run python directly


def test_slurm_master_is_the_first_node_of_the_step():
    env = detect({**SLURM, "SLURM_JOB_NODELIST": "node01", "SLURM_STEP_NODELIST": "node07"})
    assert env.master_addr == "node07"


def test_rendezvous_timeout_from_the_environment():
    assert rendezvous_timeout_s({}) == 300
    assert rendezvous_timeout_s({"VITLARGE_RENDEZVOUS_TIMEOUT": "7.5"}) == 7.5
    for bad in ("0", "-3", "5s", ""):
        with pytest.raises(UserError, match="VITLARGE_RENDEZVOUS_TIMEOUT=.* must be a positive number"):
            rendezvous_timeout_s({"VITLARGE_RENDEZVOUS_TIMEOUT": bad})


def test_torchrun_wins_inside_a_slurm_allocation():
    env = detect({**SLURM, **TORCHRUN})
    assert env.source == "torchrun" and (env.rank, env.world_size) == (3, 8)


@pytest.mark.parametrize(
    "env",
    [
        {"RANK": "4", "WORLD_SIZE": "4"},
        {"RANK": "-1", "WORLD_SIZE": "4"},
        {"RANK": "0", "WORLD_SIZE": "0"},
        {**SLURM, "SLURM_PROCID": "16"},
    ],
)
def test_inconsistent_variables(env):
    with pytest.raises(UserError, match="inconsistent launcher variables"):
        detect(env)


@pytest.mark.parametrize(
    "env, var",
    [
        ({"RANK": "zero", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "2x"}, "WORLD_SIZE"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": ""}, "LOCAL_RANK"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"}, "MASTER_PORT"),
        ({**SLURM, "SLURM_NTASKS": "4(x2)"}, "SLURM_NTASKS"),
        ({**SLURM, "SLURM_JOB_ID": "12_3a"}, "SLURM_JOB_ID"),
        ({**SLURM, "MASTER_PORT": "auto"}, "MASTER_PORT"),
    ],
)
def test_non_integer_names_the_variable(env, var):
    with pytest.raises(UserError, match=f"environment variable {var}=.* is not an integer"):
        detect(env)


def test_no_variables_is_a_single_process():
    env = detect({"SLURM_JOB_ID": "7", "PATH": "/bin"})  # an allocation without srun: still one process
    assert (env.rank, env.world_size, env.local_rank, env.source, env.is_main) == (0, 1, 0, "single", True)
    assert env.master_addr == "127.0.0.1" and 0 < env.master_port < 65536


def test_auto_device_on_this_host():
    device, backend = choose_device("auto")
    if torch.cuda.is_available():
        assert (device.type, backend) == ("cuda", "nccl")
    else:
        assert (device, backend) == (torch.device("cpu"), "gloo")
    assert choose_device("cpu") == (torch.device("cpu"), "gloo")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_cuda_requested_without_cuda():
    with pytest.raises(UserError, match="train.device=cuda but no CUDA device"):
        choose_device("cuda")


@pytest.mark.parametrize("visible, local_rank, index", [(1, 3, 0), (4, 3, 3)])
def test_cuda_device_follows_what_slurm_makes_visible(monkeypatch, visible, local_rank, index):
    """srun --gpus-per-task=1 shows each task one GPU (device 0); --gpus-per-node shows all of them."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert choose_device("auto", local_rank) == (torch.device("cuda", index), "nccl")
    assert chosen == [index]


def test_more_local_ranks_than_visible_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    with pytest.raises(UserError, match="local rank 5 but only 4 CUDA devices"):
        choose_device("auto", 5)


def test_rendezvous_nobody_listens(monkeypatch):
    """Rank 1 of 2 waits for a master that never starts: a one-line RendezvousFailed (exit 69) naming host:port, in time. In this
    process: it leaves no group behind, and MASTER_ADDR/MASTER_PORT (which it sets) are put back after."""
    import torch.distributed as dist

    from vitlarge.distributed.launcher import free_port
    from vitlarge.distributed.process import init_distributed

    assert not dist.is_initialized()  # else init_distributed would keep that group and return
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)  # restored at teardown
    port = free_port()  # bound and released: nobody listens on it
    t0 = time.monotonic()
    with pytest.raises(RendezvousFailed) as e:
        init_distributed(DistEnv(1, 2, 1, "127.0.0.1", port, "test"), "gloo", timeout_s=1)
    assert e.value.exit_status == EXIT_RENDEZVOUS
    elapsed = time.monotonic() - t0
    message = str(e.value)
    assert "\n" not in message
    assert f"127.0.0.1:{port}" in message and "within 1s" in message and "rank 1 of 2" in message
    assert not dist.is_initialized()
    assert elapsed < 45  # the timeout is honoured, not the 300 s default


@pytest.mark.parametrize(
    "env, rank",
    [
        ({}, 0),
        (TORCHRUN, 3),
        (SLURM, 5),
        ({"RANK": "1"}, 1),
        ({"RANK": "one"}, None),
        ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"}, None),
    ],
)
def test_launcher_rank_is_read_without_validation(env, rank):
    assert launcher_rank(env) == rank


def test_an_error_every_rank_meets_is_printed_by_rank_0_only():
    same = UserError("bad key")
    local = UserError("no GPU", same_on_all_ranks=False)
    agreed = UserError("rank 1 cannot read", same_on_all_ranks=True)
    rank = {r: DistEnv(r, 4, r, "127.0.0.1", 1, "torchrun") for r in (0, 1)}

    def printed(error, group_exists):
        return [prints_error(error, rank[r], group_exists) for r in (0, 1)]

    # Before the process group exists an error comes from input all ranks read alike; after, a rank may fail alone.
    assert printed(same, False) == [True, False] and printed(same, True) == [True, True]
    assert printed(local, False) == [True, True] and printed(local, True) == [True, True]
    assert printed(agreed, False) == [True, False] and printed(agreed, True) == [True, False]
    # detect() itself failed: the launcher's variable says who will be rank 0.
    for env, expected in (({"RANK": "0", "WORLD_SIZE": "9"}, True), ({"RANK": "2", "WORLD_SIZE": "1"}, False)):
        with pytest.MonkeyPatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            assert prints_error(same, None, group_exists=False) is expected


# --- thread pools: sized from what the launcher gave the process, never more threads than its CPU share -- ---------------------------------

# What srun -N 2 -n 4 exports to a task on the second node (no --cpus-per-task): tasks per node "2(x2)".
SRUN_NODE2 = {
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}


@pytest.mark.parametrize(
    "env, cpus, threads, why",
    [
        ({}, 16, 16, "16 usable CPUs, one process"),  # plain python: the whole affinity mask
        ({"OMP_NUM_THREADS": "3"}, 16, 3, "OMP_NUM_THREADS=3"),  # the user's value wins
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"},
            2,
            1,
            "OMP_NUM_THREADS=1",
        ),  # torchrun / colossalai run with --nproc_per_node 2
        ({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, 32, 8, "32 usable CPUs / 4 tasks"),
        ({**SRUN_NODE2, "SLURM_CPUS_PER_TASK": "6"}, 48, 6, "SLURM_CPUS_PER_TASK=6"),  # srun -c 6
        ({**SRUN_NODE2, "SLURM_CPUS_PER_TASK": "6", "OMP_NUM_THREADS": "2"}, 48, 2, "OMP_NUM_THREADS=2"),
        (
            SRUN_NODE2,
            2,
            1,
            "2 usable CPUs / 2 tasks on this node (SLURM_STEP_TASKS_PER_NODE)",
        ),  # 2 tasks on a 2-CPU node: 1 each
        (SRUN_NODE2, 3, 1, "3 usable CPUs / 2 tasks"),  # rounds down: never more threads than cores
        # Uneven: 7 tasks on 3 nodes are 3,2,2; the third node (SLURM_NODEID=2) has 2 of them.
        ({"SLURM_STEP_TASKS_PER_NODE": "3,2(x2)", "SLURM_NODEID": "2"}, 8, 4, "8 usable CPUs / 2 tasks"),
        ({"SLURM_STEP_TASKS_PER_NODE": "3,2(x2)", "SLURM_NODEID": "0"}, 8, 2, "8 usable CPUs / 3 tasks"),
        ({"SLURM_NTASKS_PER_NODE": "4"}, 8, 2, "(SLURM_NTASKS_PER_NODE)"),
        ({"SLURM_STEP_TASKS_PER_NODE": "8"}, 2, 1, "2 usable CPUs / 8 tasks"),  # oversubscribed: still 1
        # A mask Slurm bound to the task (--cpu-bind, cgroups) is its share as it is, not divided again.
        (
            {"SLURM_STEP_TASKS_PER_NODE": "8(x16)", "SLURM_NODEID": "3", "SLURM_JOB_CPUS_PER_NODE": "64(x16)"},
            8,
            8,
            "8 CPUs bound to this task",
        ),  # task/cgroup --cpu-bind=cores: mask 8 of the node's 64
        ({"SLURM_STEP_TASKS_PER_NODE": "8(x16)", "SLURM_CPU_BIND_TYPE": "mask_cpu:"}, 8, 8, "bound to this task"),
        (
            {"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_CPU_BIND_TYPE": "none", "SLURM_JOB_CPUS_PER_NODE": "2"},
            2,
            1,
            "2 usable CPUs / 2 tasks",
        ),  # --cpu-bind=none, mask = the whole allocation: divided
        ({"SLURM_CPUS_PER_TASK": "8"}, 1, 1, "SLURM_CPUS_PER_TASK=8 capped by the 1 usable CPUs"),
        (
            {
                "SLURM_TASKS_PER_NODE": "4",
                "SLURM_NODEID": "5",
                "SLURM_STEP_NUM_TASKS": "24",
                "SLURM_STEP_NUM_NODES": "6",
            },
            64,
            16,
            "64 usable CPUs / 4 tasks on this node (SLURM_STEP_NUM_TASKS / SLURM_STEP_NUM_NODES",
        ),  # not 64
        ({"SLURM_TASKS_PER_NODE": "4", "SLURM_NODEID": "5"}, 64, 16, "SLURM_TASKS_PER_NODE, largest entry"),
        (
            {"SLURM_STEP_TASKS_PER_NODE": "3", "SLURM_NODEID": "1", "SLURM_NTASKS": "5", "SLURM_NNODES": "2"},
            12,
            4,
            "12 usable CPUs / 3 tasks",
        ),  # ceil(5 / 2)
        ({"OMP_NUM_THREADS": "4,2"}, 16, 4, "OMP_NUM_THREADS=4"),  # OpenMP nested form: the first level
    ],
)
def test_thread_budget(env, cpus, threads, why):
    n, reason = thread_budget(env, cpus)
    assert n == threads and why in reason, (n, reason)


# DALI's default: the CPU share, never torchrun's blanket OMP_NUM_THREADS=1 (which would starve the decoders).
@pytest.mark.parametrize(
    "env, cpus, threads, why",
    [
        # colossalai run / torchrun --nproc_per_node 8 on a 64-core node: 8, not 1 (the old fixed 4 was below it)
        (
            {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8", "OMP_NUM_THREADS": "1"},
            64,
            8,
            "64 usable CPUs / 8 tasks",
        ),
        # torchrun 2 workers on 2 cores: 1 each, the share (more would fight PyTorch's threads)
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"},
            2,
            1,
            "2 usable CPUs / 2 tasks",
        ),
        # srun bound to 8 cores per task on 16 nodes
        (
            {
                **SRUN_NODE2,
                "SLURM_STEP_TASKS_PER_NODE": "8(x16)",
                "SLURM_CPU_BIND_TYPE": "cores",
                "OMP_NUM_THREADS": "1",
            },
            8,
            8,
            "8 CPUs bound to this task",
        ),
        ({**SRUN_NODE2, "SLURM_CPUS_PER_TASK": "6", "OMP_NUM_THREADS": "2"}, 48, 6, "SLURM_CPUS_PER_TASK=6"),
        ({**SRUN_NODE2, "SLURM_CPUS_PER_TASK": "16"}, 4, 4, "capped by the 4 usable CPUs"),
        ({"OMP_NUM_THREADS": "1"}, 16, 16, "16 usable CPUs, one process"),  # plain python with a user's OMP=1
    ],
)
def test_dali_threads_follow_the_cpu_share_not_omp(env, cpus, threads, why):
    from vitlarge.distributed.threads import dali_threads

    n, reason = dali_threads(env, cpus)
    assert n == threads and why in reason, (n, reason)


@pytest.mark.parametrize(
    "env",
    [
        {"OMP_NUM_THREADS": "0"},
        {"SLURM_CPUS_PER_TASK": "x"},
        {"OMP_NUM_THREADS": "x,2"},
        {"SLURM_STEP_TASKS_PER_NODE": "2(x"},
    ],
)
def test_thread_budget_bad_values_name_the_variable(env):
    with pytest.raises(UserError, match=next(iter(env))):
        thread_budget(env, 4)


# --- the interface gloo and NCCL bind to across nodes -------------------------------------------------------


def test_route_interface_to_loopback_ipv6_and_an_unknown_host():
    from vitlarge.distributed.network import route_interface

    assert route_interface("127.0.0.1", 29500) == ("lo", "127.0.0.1")
    assert route_interface("::1", 29500) == ("lo", "::1")  # AF_UNSPEC: an IPv6 master is routed too
    with pytest.raises(OSError):
        route_interface("no-such-host.invalid", 29500)


def test_bind_interface_sets_only_gloo_and_only_what_the_user_left_unset():
    """NCCL picks its own interface (we never set NCCL_SOCKET_IFNAME); gloo gets the route to the master."""
    from vitlarge.distributed.network import bind_interface

    slurm = DistEnv(1, 2, 0, "127.0.0.1", 29500, "slurm")  # one node (no SLURM_STEP_NUM_NODES): loopback is right
    env = {}
    assert bind_interface(slurm, env) == "lo" and env == {"GLOO_SOCKET_IFNAME": "lo"}
    env = {"NCCL_SOCKET_IFNAME": "=ib0"}
    assert bind_interface(slurm, env) == "lo" and env == {"NCCL_SOCKET_IFNAME": "=ib0", "GLOO_SOCKET_IFNAME": "lo"}
    env = {"GLOO_SOCKET_IFNAME": "eth1"}
    assert bind_interface(slurm, env) == "eth1" and env == {"GLOO_SOCKET_IFNAME": "eth1"}
    for other in (DistEnv(0, 1, 0, "127.0.0.1", 29500, "slurm"), DistEnv(0, 2, 0, "127.0.0.1", 29500, "torchrun")):
        env = {}
        assert bind_interface(other, env) == "" and env == {}  # one process, or torchrun: left as it was


def test_unroutable_master_leaves_gloo_to_its_default_with_a_warning(caplog):
    from vitlarge.distributed.network import bind_interface

    env = {"SLURM_STEP_NUM_NODES": "2"}
    with caplog.at_level("WARNING", logger="vitlarge"):
        assert bind_interface(DistEnv(1, 2, 0, "no-such-host.invalid", 29500, "slurm"), env) == ""
    assert (
        "GLOO_SOCKET_IFNAME" not in env and "cannot resolve or route to the master no-such-host.invalid" in caplog.text
    )


def test_loopback_master_on_a_multi_node_step_is_never_exported():
    """The master's name resolves to 127.0.1.1 on its own node (Debian's /etc/hosts). With
    several nodes, lo is never exported: the route to another host of the step, or one line naming the entry."""
    from vitlarge.distributed.network import bind_interface, route_interface

    master = DistEnv(0, 2, 0, "127.0.1.1", 29500, "slurm")
    env = {"SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "127.0.0.2"}  # the other "node" is loopback too
    with pytest.raises(UserError, match=r"resolves to the loopback address 127\.0\.1\.1 \(an /etc/hosts entry"):
        bind_interface(master, env)
    assert "GLOO_SOCKET_IFNAME" not in env
    other = "10.255.255.1"  # a host of the step reached through this machine's default route
    try:
        expected = route_interface(other, 29500)[0]
    except OSError:
        expected = ""
    env = {"SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": other}
    if expected in ("", "lo"):  # no default route here: the clear line again
        with pytest.raises(UserError, match="/etc/hosts"):
            bind_interface(master, env)
    else:
        assert bind_interface(master, env) == expected != "lo" and env["GLOO_SOCKET_IFNAME"] == expected


def test_rendezvous_error_names_host_interface_time_and_claims_a_timeout_only_for_one():
    import socket as _socket

    from vitlarge.distributed.process import rendezvous_error

    env = DistEnv(1, 4, 1, "node1", 21234, "slurm")
    timeout = rendezvous_error(env, RuntimeError("Socket Timeout"), 5.2, 5.0, "eth0")
    assert timeout.startswith(
        "rendezvous at node1:21234 did not complete within 5s (rank 1 of 4, slurm; on "
        f"{_socket.gethostname()}, interface eth0, 5.2s): Socket Timeout"
    )
    other = rendezvous_error(env, RuntimeError("Connection reset by peer\nmore"), 0.4, 300.0, "")
    assert "failed after 0.4s" in other and "did not complete" not in other
    assert "interface default" in other and other.endswith(
        "Connection reset by peer; check that every process started and that the address is reachable"
    )


no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host where CUDA sees no GPU")


@pytest.fixture
def gpu_env(monkeypatch):
    """This process's environment without the variables that name GPUs; the test sets the one it needs."""
    for name in GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@no_cuda
@pytest.mark.parametrize(
    "name, value",
    [
        ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),  # torchrun passes its own environment on: a node's GPUs
        ("SLURM_GPUS_ON_NODE", "4"),  # srun, --gpus-per-node / --gres=gpu:4
        ("SLURM_GPUS_PER_NODE", "h100:8"),
        ("SLURM_STEP_GPUS", "0,1"),
        ("SLURM_JOB_GPUS", "2"),
        ("CUDA_VISIBLE_DEVICES", "0"),  # GPU 0 is a GPU, not a count of none
        ("SLURM_STEP_GPUS", "0"),
        ("SLURM_GPUS_PER_NODE", "a100:4,v100:0"),  # counts that add up to 4
        ("SLURM_GPUS_ON_NODE", "gpu:4(IDX:0-3)"),  # gres with indices: 4
    ],
)
def test_auto_refuses_the_cpu_when_the_job_asked_for_gpus(gpu_env, name, value):
    """A job step that asked for GPUs and sees none stops before the rendezvous, naming the variable and both fixes."""
    gpu_env.setenv(name, value)
    with pytest.raises(UserError) as e:
        choose_device("auto")
    line = f"error: {e.value}"
    assert line == (
        f"error: train.device=auto found no CUDA GPU, but {name}={value} says this job has GPUs "
        f"({torch_without_cuda()}); give the job step its GPUs (srun --gpus-per-node, a container's --gpus / --nv), "
        "or pass train.device=cpu to train on the CPU anyway"
    )
    assert e.value.same_on_all_ranks is False  # a node's own setup: the rank that meets it names itself
    assert choose_device("cpu") == (torch.device("cpu"), "gloo")  # the fix the line gives works


def torch_without_cuda() -> str:
    return "this torch is built without CUDA" if torch.version.cuda is None else "CUDA's driver sees no device"


@no_cuda
@pytest.mark.parametrize(
    "name, value",
    [
        ("CUDA_VISIBLE_DEVICES", ""),  # hidden on purpose
        ("CUDA_VISIBLE_DEVICES", "-1"),
        ("CUDA_VISIBLE_DEVICES", "NoDevFiles"),  # Slurm's value where the job has no GPU
        ("SLURM_GPUS_ON_NODE", "0"),
        ("SLURM_GPUS_PER_NODE", "0"),
        ("SLURM_GPUS_PER_NODE", "a100:0,v100:0"),
        ("SLURM_JOB_GPUS", ""),
        ("CUDA_VISIBLE_DEVICES", "none"),
        ("CUDA_VISIBLE_DEVICES", "-1,0"),  # CUDA reads up to the first invalid id: none
        ("CUDA_VISIBLE_DEVICES", ","),
    ],
)
def test_auto_takes_the_cpu_when_nothing_asked_for_gpus(gpu_env, name, value):
    gpu_env.setenv(name, value)
    assert choose_device("auto") == (torch.device("cpu"), "gloo")


def test_two_ranks_on_one_gpu_stop_before_the_process_group():
    """Two ranks of one host whose CUDA device is the same GPU (its UUID: what NCCL would refuse at the first
    collective, `Duplicate GPU detected`) stop at the rendezvous with one line naming both ranks and the GPU; the
    same host with distinct GPUs (srun --gpus-per-task=1: device 0 of each task is another GPU) passes. Real
    rendezvous stores, one thread per rank."""
    import threading

    import torch.distributed as dist

    from vitlarge.distributed.launcher import free_port
    from vitlarge.distributed.process import _all_started

    def rendezvous(gpus: list[str]) -> list:
        port, world = free_port(), len(gpus)
        master = dist.TCPStore("127.0.0.1", port, world, is_master=True, wait_for_workers=False)
        found: list = [None] * world

        def rank(r: int) -> None:
            store = master if r == 0 else dist.TCPStore("127.0.0.1", port, world, is_master=False)
            try:
                env = DistEnv(r, world, r, "127.0.0.1", port, "test")
                _all_started(dist.PrefixStore("s", store), env, time.monotonic() + 30, gpu=("node07", gpus[r]))
            except UserError as e:
                found[r] = e

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        counts.update(seen=master.add("s/seen", 0), failed=master.add("s/failed", 0))
        return found

    counts = {}
    assert rendezvous(["GPU-aaaa", "GPU-bbbb"]) == [None, None]
    found = rendezvous(["GPU-aaaa", "GPU-bbbb", "GPU-aaaa"])
    # Each rank counted once: the one that clashed in "failed" only. Counted in "seen" too, rank 0 (the store's
    # host under srun) would stop waiting while a rank still sleeping in its poll had not heard, and leave: that
    # rank then met a closed store ("DistNetworkError"), not the line.
    assert counts == {"seen": 2, "failed": 1}, counts
    assert all(isinstance(e, UserError) for e in found), found
    lines = {str(e) for e in found}
    assert len(lines) == 1, lines  # every rank stops with the same line (rank 0 prints it)
    ranks = "ranks 0 and 2 on node07 would both use the GPU GPU-aaaa; "
    fix = (
        "start one process per GPU (torchrun --nproc_per_node or srun --ntasks-per-node equal to the node's GPUs, "
        "or srun --gpus-per-task=1)"
    )
    assert lines.pop() in {f"rank {r} on node07 stopped the run before the rendezvous: {ranks}{fix}" for r in (0, 2)}


@pytest.mark.parametrize("script", ["vit_b16_1node.sbatch", "vit_b16_multinode.sbatch"])
def test_gpu_batch_scripts_ask_for_cuda(script):
    """The GPU batch scripts train on CUDA or stop (train.device=cuda, before the user's arguments, which may
    override it): never the CPU fallback."""
    from tests.helpers import ROOT

    lines = [
        line for line in (ROOT / "scripts/slurm" / script).read_text().splitlines() if " train.py --config " in line
    ]
    assert len(lines) == 1 and lines[0].endswith(' train.device=cuda "$@"'), lines


def test_a_lazy_module_runs_its_import_at_the_first_name_read_from_it_not_at_a_scan(tmp_path, monkeypatch):
    """`quiet_imports` makes W&B such a module (timm imports it at its own import); planted packages here."""
    import builtins
    import inspect
    import sys

    from vitlarge.distributed import process

    site = tmp_path / "site"
    site.mkdir()
    (site / "vitlarge_lazy_ok.py").write_text(
        "import builtins\nbuiltins.lazy_runs = builtins.lazy_runs + 1\nSettings = 'settings'\n"
    )
    (site / "vitlarge_lazy_broken.py").write_text("raise TypeError('Descriptors cannot be created directly.')\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(builtins, "lazy_runs", 0, raising=False)
    try:
        for name in ("vitlarge_lazy_ok", "vitlarge_lazy_broken", "vitlarge_lazy_not_installed"):
            process._import_lazily(name)
        assert "vitlarge_lazy_not_installed" not in sys.modules
        import vitlarge_lazy_ok  # pyright: ignore[reportMissingImports]

        inspect.getmodule(test_a_lazy_module_runs_its_import_at_the_first_name_read_from_it_not_at_a_scan)  # reads
        assert builtins.lazy_runs == 0 and vitlarge_lazy_ok.__file__.endswith("vitlarge_lazy_ok.py")  # every __file__
        assert vitlarge_lazy_ok.Settings == "settings" and builtins.lazy_runs == 1
        assert type(vitlarge_lazy_ok) is type(sys) and vitlarge_lazy_ok.Settings and builtins.lazy_runs == 1
        import vitlarge_lazy_broken  # pyright: ignore[reportMissingImports]

        with pytest.raises(TypeError, match="Descriptors"):
            _ = vitlarge_lazy_broken.anything
        assert "vitlarge_lazy_broken" not in sys.modules  # as after a failed import: the next import tries again
    finally:
        for name in ("vitlarge_lazy_ok", "vitlarge_lazy_broken"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize("bad", ["inf", "-inf", "nan", "1e300", "604801", "-1"])
def test_a_rendezvous_timeout_no_timedelta_holds_is_one_line_with_the_range(bad):
    """inf, nan and 1e300 overflowed a timedelta (a traceback): the variable's range is said instead."""
    with pytest.raises(UserError) as e:
        rendezvous_timeout_s({"VITLARGE_RENDEZVOUS_TIMEOUT": bad})
    assert str(e.value) == (
        f"environment variable VITLARGE_RENDEZVOUS_TIMEOUT={bad!r} must be a positive number of seconds, at most "
        "604,800 (a week); unset it to wait train.init_timeout_s"
    )
    assert rendezvous_timeout_s({"VITLARGE_RENDEZVOUS_TIMEOUT": "604800"}) == 604800


def test_the_stop_line_after_colossalai_run_lets_go_of_its_stream(monkeypatch):
    """Rank 0 keeps ``colossalai run``'s stderr for the line a SIGTERM to its group leaves without a reader. Where that
    stderr is a pipe (``subprocess.run(capture_output=True)``, ``| tee``), the reader sees its end once the line is
    written, not when the worker exits (before: it held the pipe to its last instruction)."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    monkeypatch.setattr(launcher, "_after_launcher", write)
    try:
        assert launcher.say_after_colossalai_run("vitlarge: stopped on signal after step 5")
        assert os.read(read, 4096).startswith(b"vitlarge: stopped on signal after step 5 (after colossalai run had")
        assert os.read(read, 4096) == b""  # the end of the stream: no writer is left
        assert launcher._after_launcher is None and not launcher.say_after_colossalai_run("again")
    finally:
        os.close(read)
        with contextlib.suppress(OSError):
            os.close(write)
