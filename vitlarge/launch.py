"""Process-group setup for every way a run is started, and the one place device and backend are chosen.

Supported launchers, detected from the environment:

* ``colossalai run`` / ``torchrun``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``.
* ``srun`` (Slurm): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``; the master is the first host
  of the step's node list (``SLURM_STEP_NODELIST``, else ``SLURM_JOB_NODELIST``, expanded by
  ``scontrol show hostnames``) and the port is derived from the job id unless ``MASTER_PORT`` is set.
  Only srun sets ``SLURM_STEP_ID``: a batch script also has ``SLURM_PROCID=0`` and the job's
  ``SLURM_NTASKS``, and ``python train.py`` run there directly would wait for tasks that never start.
* plain ``python train.py``: one process, world size 1.

We initialise ``torch.distributed`` ourselves instead of calling ``colossalai.launch``, which
ignores its ``backend`` argument and takes the accelerator's (nccl), so it cannot give gloo on a
CPU-only host. Booster and its plugins only need an initialised default process group.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass

from vitlarge.errors import UserError


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job. ``source`` names the launcher that was detected."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int_env(env, key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise UserError(
            f"environment variable {key}={env[key]!r} is not an integer; fix the launcher settings"
        ) from None


def _slurm_hosts(nodelist: str) -> list[str]:
    """The host names of a Slurm node list (``vlnode[1-2]``), expanded by ``scontrol show hostnames``."""
    if not any(c in nodelist for c in "[,"):
        return [nodelist]
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        hosts = out.stdout.split()
        if not hosts:
            raise IndexError
        return hosts
    except (OSError, subprocess.CalledProcessError, IndexError):
        raise UserError(
            f"cannot expand SLURM_JOB_NODELIST={nodelist!r} with 'scontrol show hostnames'; set MASTER_ADDR"
        ) from None


def _first_slurm_host(nodelist: str) -> str:
    return _slurm_hosts(nodelist)[0]


def detect(env=None) -> DistEnv:
    """Reads the launcher's variables; torchrun's win over Slurm's (torchrun inside an allocation)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE")
        local = _int_env(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        addr = env.get("MASTER_ADDR", "127.0.0.1")
        port = _int_env(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500
        source = "torchrun"
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = _int_env(env, "SLURM_PROCID"), _int_env(env, "SLURM_NTASKS")
        if world > 1 and "SLURM_STEP_ID" not in env:
            raise UserError(
                f"this is a Slurm batch script (SLURM_NTASKS={world} but no SLURM_STEP_ID), not one of its "
                "tasks; start train.py with srun (srun python train.py ...) so that every task runs"
            )
        local = _int_env(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "127.0.0.1")
        addr = env.get("MASTER_ADDR") or _first_slurm_host(nodelist)
        job = _int_env(env, "SLURM_JOB_ID") if env.get("SLURM_JOB_ID") else 0
        port = _int_env(env, "MASTER_PORT") if env.get("MASTER_PORT") else 20000 + job % 20000
        source = "slurm"
    else:
        rank, world, local = 0, 1, 0
        addr, port, source = "127.0.0.1", free_port(), "single"
    if world < 1 or not 0 <= rank < world:
        raise UserError(
            f"inconsistent launcher variables ({source}): rank {rank} with world size {world}; "
            "check --nproc_per_node / srun -n"
        )
    return DistEnv(rank, world, local, addr, port, source)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def choose_device(requested: str = "auto", local_rank: int = 0):
    """The one place that maps the config's ``train.device`` to a torch device and a backend."""
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device=cuda but no CUDA device is visible; use train.device=cpu or auto")
    if requested != "cpu" and torch.cuda.is_available():
        # One visible GPU per process (srun --gpus-per-task=1, --gpu-bind) is device 0 whatever the local rank.
        count = torch.cuda.device_count()
        index = 0 if count == 1 else local_rank
        if index >= count:
            raise UserError(
                f"local rank {local_rank} but only {count} CUDA devices are visible to it; start one process "
                "per GPU (srun --ntasks-per-node equal to --gpus-per-node)",
                same_on_all_ranks=False,
            )
        torch.cuda.set_device(index)
        return torch.device("cuda", index), "nccl"
    return torch.device("cpu"), "gloo"


def _slurm_counts(env, key: str) -> list[int]:
    """A Slurm per-node count list (``"2(x3),1"``: 2 on each of the first 3 nodes, 1 on the fourth)."""
    counts = []
    for part in env[key].split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise UserError(f"environment variable {key}={env[key]!r} is not a Slurm per-node count list")
        counts += [int(m[1])] * int(m[2] or 1)
    return counts


def _node_entry(env, key: str) -> int | None:
    """This node's entry (``SLURM_NODEID``) of the count list ``key``; None when unset or out of range
    (heterogeneous steps; the job-level lists are indexed by job nodes, SLURM_NODEID by step nodes)."""
    if not env.get(key):
        return None
    counts = _slurm_counts(env, key)
    node = _int_env(env, "SLURM_NODEID") if env.get("SLURM_NODEID") else 0
    return counts[node] if node < len(counts) else None


def _tasks_on_this_node(env) -> tuple[int, str] | None:
    """How many tasks of this job step share this node, from the launcher's variables (None: unknown).

    Slurm: ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` indexed by ``SLURM_NODEID``; if the
    node is not in the list, the step's average rounded up (``SLURM_STEP_NUM_TASKS`` / ``SLURM_STEP_NUM_NODES``,
    never "one task": that would give every task the whole node); else ``SLURM_NTASKS_PER_NODE``.
    torchrun: ``LOCAL_WORLD_SIZE``."""
    if "LOCAL_WORLD_SIZE" in env:
        return _int_env(env, "LOCAL_WORLD_SIZE"), "LOCAL_WORLD_SIZE"
    listed = [k for k in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if env.get(k)]
    for key in listed:
        n = _node_entry(env, key)
        if n is not None:
            return n, key
    for tasks, nodes in (("SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES"), ("SLURM_NTASKS", "SLURM_NNODES")):
        if env.get(tasks) and env.get(nodes) and _int_env(env, nodes) >= 1:
            return -(-_int_env(env, tasks) // _int_env(env, nodes)), f"{tasks} / {nodes}, rounded up"
    if env.get("SLURM_NTASKS_PER_NODE"):
        return _int_env(env, "SLURM_NTASKS_PER_NODE"), "SLURM_NTASKS_PER_NODE"
    if listed:  # a list that does not cover this node and nothing to average: the largest entry
        return max(_slurm_counts(env, listed[0])), f"{listed[0]}, largest entry"
    return None


def _bound_per_task(env, usable_cpus: int) -> bool:
    """Whether Slurm already bound this task to its own CPUs (task/affinity or task/cgroup with
    ``--cpu-bind=cores`` etc.): the mask is then this task's share, not the node's."""
    bind = env.get("SLURM_CPU_BIND_TYPE", "").strip().lower()
    if bind and not bind.startswith("none"):
        return True
    allocated = _node_entry(env, "SLURM_JOB_CPUS_PER_NODE") if env.get("SLURM_JOB_CPUS_PER_NODE") else None
    return allocated is not None and usable_cpus < allocated


def cpu_share(env, usable_cpus: int) -> tuple[int, str]:
    """The CPUs this process may use, and why; the size of DALI's default pool (``data.num_threads=0``) and,
    unless ``OMP_NUM_THREADS`` is set, of PyTorch's. Ignores ``OMP_NUM_THREADS`` on purpose: torchrun
    exports 1 to every worker whatever the CPUs, which says nothing about how many a data pipeline may use.

    ``usable_cpus`` is this process's affinity mask. A mask Slurm bound to this task alone is the share as
    it is; ``SLURM_CPUS_PER_TASK`` (capped by the mask: from 22.05 srun does not inherit it from sbatch, yet
    the variable still reaches the tasks); else the mask divided by the tasks on this node. At least 1.
    Pure: ``env`` and the CPU count are arguments."""
    usable_cpus = max(1, usable_cpus)
    if _bound_per_task(env, usable_cpus):
        return usable_cpus, f"{usable_cpus} CPUs bound to this task by Slurm"
    if env.get("SLURM_CPUS_PER_TASK"):
        n = _int_env(env, "SLURM_CPUS_PER_TASK")
        if n < 1:
            raise UserError(
                f"environment variable SLURM_CPUS_PER_TASK={env['SLURM_CPUS_PER_TASK']} must be a positive CPU count"
            )
        if n > usable_cpus:
            return usable_cpus, f"SLURM_CPUS_PER_TASK={n} capped by the {usable_cpus} usable CPUs"
        return n, f"SLURM_CPUS_PER_TASK={n}"
    tasks = _tasks_on_this_node(env)
    if tasks is None or tasks[0] < 1:
        return usable_cpus, f"{usable_cpus} usable CPUs, one process on this node"
    return max(1, usable_cpus // tasks[0]), f"{usable_cpus} usable CPUs / {tasks[0]} tasks on this node ({tasks[1]})"


def thread_budget(env, usable_cpus: int) -> tuple[int, str]:
    """PyTorch's intra-op threads for one process, and why: ``OMP_NUM_THREADS`` if set (torchrun sets 1 per
    worker; a user's value always wins; OpenMP's nested form ``"4,2"`` gives its first level), else
    ``cpu_share``. Pure: ``env`` and the CPU count are arguments."""
    raw = env.get("OMP_NUM_THREADS", "").strip()
    if raw:
        first = raw.split(",")[0].strip()
        if not first.isdigit() or int(first) < 1:
            raise UserError(f"environment variable OMP_NUM_THREADS={raw} must be a positive thread count")
        return int(first), f"OMP_NUM_THREADS={first}"
    return cpu_share(env, usable_cpus)


def dali_threads(env, usable_cpus: int) -> tuple[int, str]:
    """DALI's default ``num_threads`` (recipe ``data.num_threads=0``): the process's ``cpu_share``, never
    ``OMP_NUM_THREADS`` (torchrun's blanket 1 would leave one decode/read thread per GPU). Where the share
    is 4 CPUs or more this is at least the old fixed default of 4; below that the share wins, since more
    DALI threads than CPUs only fight PyTorch's for them. Pure."""
    return cpu_share(env, usable_cpus)


def size_thread_pools(env=None) -> tuple[int, str]:
    """Sizes PyTorch's intra-op pool and ``OMP_NUM_THREADS`` by ``thread_budget``; imports no torch, so that
    train.py calls it before torch loads (PyTorch then takes the size from ``OMP_NUM_THREADS``).

    Without it every srun task runs a pool as large as the node, and N tasks fight for the cores
    (the issue-16 measurement: 2 srun tasks on 2 cores trained 3x slower than colossalai run, which
    exports OMP_NUM_THREADS=1). Returns ``thread_budget``'s (threads, why) for the caller to log once
    (rank 0), after the config checks, so that bad input stays one line; the budget is also DALI's
    default ``data.num_threads`` (``vitlarge.data.build``)."""
    env = os.environ if env is None else env
    n, why = thread_budget(env, len(os.sched_getaffinity(0)))
    # Best before torch (and with it libgomp, OpenBLAS) is first imported: they size their pools from
    # OMP_NUM_THREADS when they load. set_num_threads covers a torch that is already loaded.
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    return n, why


SOCKET_IFNAME_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def _interface_of(local: str) -> str:
    """The name of the interface that holds the address ``local`` (IPv4 or IPv6); "" if none does."""
    import fcntl
    import ipaddress
    import struct

    ip = ipaddress.ip_address(local.split("%")[0])
    if ip.version == 6:
        try:  # /proc/net/if_inet6: address (32 hex digits), index, prefix, scope, flags, name
            with open("/proc/net/if_inet6") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) >= 6 and ipaddress.ip_address(int(fields[0], 16)) == ip:
                        return fields[5]
        except OSError:
            pass
        return "lo" if ip.is_loopback else ""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's IPv4 address
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(raw[20:24]) == local:
                return name
    return "lo" if ip.is_loopback else ""


def route_interface(host: str, port: int) -> tuple[str, str]:
    """The network interface (name, this node's address on it) through which this node reaches ``host``,
    as this node resolves the name (IPv4 or IPv6: ``AF_UNSPEC``). A UDP ``connect`` picks the route and
    sends nothing. Raises ``OSError`` when the name does not resolve or no route leads there."""
    family, _, _, _, addr = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        local = s.getsockname()[0]
    return _interface_of(local), local


def _is_loopback(local: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(local.split("%")[0]).is_loopback


def _step_nodes(env) -> int:
    for key in ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return 1


def choose_interface(dist_env: DistEnv, env) -> tuple[str, str]:
    """(interface for gloo, why) for a Slurm task; ("", reason) to leave gloo's default.

    The interface that routes to the master as this node resolves its name. When that is loopback
    (Debian/Ubuntu's ``127.0.1.1 <hostname>`` line on the master's own node) and the step spans several
    nodes, gloo there would listen where no other node reaches it: the route to another host of the step
    is taken instead; if there is none, a ``UserError`` names the /etc/hosts entry. A name that does not
    resolve or route leaves the choice to gloo (TCPStore then reports the real problem)."""
    where = socket.gethostname()
    try:
        name, local = route_interface(dist_env.master_addr, dist_env.master_port)
    except OSError as e:
        return "", f"cannot resolve or route to the master {dist_env.master_addr} from {where} ({e})"
    if not _is_loopback(local) or _step_nodes(env) <= 1:
        return name, f"routes to the master {dist_env.master_addr}"
    me = {env.get("SLURMD_NODENAME", ""), where, where.split(".")[0]}
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    for host in (h for h in (_slurm_hosts(nodelist) if nodelist else []) if h not in me):
        try:
            other, mine = route_interface(host, dist_env.master_port)
        except OSError:
            continue
        if other and not _is_loopback(mine):
            return other, f"routes to {host} (the master {dist_env.master_addr} resolves to loopback here)"
    resolved = socket.getaddrinfo(dist_env.master_addr, dist_env.master_port, socket.AF_UNSPEC, socket.SOCK_DGRAM)[0][
        4
    ][0]
    raise UserError(
        f"on {where} the master {dist_env.master_addr} resolves to the loopback address {resolved} (an /etc/hosts "
        f"entry such as '127.0.1.1 {dist_env.master_addr}'), and no other node of the step routes elsewhere: the "
        "other nodes could not reach gloo here; fix that /etc/hosts entry or set GLOO_SOCKET_IFNAME to the "
        "interface the nodes share",
        same_on_all_ranks=False,
    )


def bind_interface(dist_env: DistEnv, env=None) -> str:
    """Under Slurm (world > 1), points gloo at ``choose_interface`` unless the user set
    ``GLOO_SOCKET_IFNAME``; returns the interface gloo will use ("" when left to gloo, with a warning if
    no route was found). Without it gloo binds to the address this node's hostname resolves to, which on
    many clusters (and in network namespaces) is loopback or a network the other nodes cannot reach.

    ``NCCL_SOCKET_IFNAME`` is left to NCCL (decided after review 16, finding 5): NCCL already skips
    ``lo`` and ``docker*`` and prefers ``ib*``; forcing the interface that routes to the master would move
    its bootstrap and socket fallback onto a management network on IB + Ethernet nodes, and a bare name
    is a prefix to NCCL (``eth0`` also matches ``eth0.100``). Users set it themselves (``=ib0``: exact)."""
    env = os.environ if env is None else env
    if dist_env.source != "slurm" or dist_env.world_size == 1 or env.get("GLOO_SOCKET_IFNAME"):
        return env.get("GLOO_SOCKET_IFNAME", "")
    name, why = choose_interface(dist_env, env)
    if name:
        env["GLOO_SOCKET_IFNAME"] = name
    else:
        import logging

        logging.getLogger("vitlarge").warning(
            f"{why}: gloo's interface left to its default; set GLOO_SOCKET_IFNAME if the rendezvous fails"
        )
    return name


RENDEZVOUS_TIMEOUT_ENV = "VITLARGE_RENDEZVOUS_TIMEOUT"
"""Seconds to wait for every process to join (default 300): a missing task fails the run after this."""


def rendezvous_timeout_s(env=None) -> float:
    env = os.environ if env is None else env
    raw = env.get(RENDEZVOUS_TIMEOUT_ENV, "300")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise UserError(f"environment variable {RENDEZVOUS_TIMEOUT_ENV}={raw!r} must be a positive number of seconds")
    return value


# torch 2.5 deadlocks at exit, now and then, when the DDP Reducer drops the last reference to the
# gloo process group: ~ProcessGroupGloo joins its worker threads while holding the GIL, and a worker
# that is still releasing the tensors of the last all-reduce waits for the GIL (fixed upstream by
# "Release GIL in PG destructor", pytorch#154976). Holding a reference here moves the destruction
# to interpreter exit, when the workers are long idle. Seen as srun/torchrun never returning after
# "exported ...".
_KEEP_ALIVE: list = []


def init_distributed(
    dist_env: DistEnv, backend: str, timeout_s: float | None = None, collective_timeout_s: float = 300.0
) -> None:
    """Initialises the default process group (also for world size 1, so one code path).

    ``timeout_s`` bounds the rendezvous only (every process connected to the master's store);
    it defaults to ``$VITLARGE_RENDEZVOUS_TIMEOUT`` or 300 s. Collectives, and store operations
    after the rendezvous, get ``collective_timeout_s``: a short rendezvous timeout must not make a
    long checkpoint write on rank 0 look like a hang to the other ranks.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if timeout_s is None:
        timeout_s = rendezvous_timeout_s()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = dist_env.master_addr, str(dist_env.master_port)
    ifname = bind_interface(dist_env)
    if dist_env.local_rank == 0 and dist_env.source == "slurm" and dist_env.world_size > 1:
        import logging  # every node's first task: the interface is chosen per node

        logging.getLogger("vitlarge").info(
            f"rendezvous at {dist_env.master_addr}:{dist_env.master_port}, gloo interface on {socket.gethostname()}: "
            f"{ifname or '(gloo default)'}"
        )
    t0 = time.monotonic()
    try:
        # The master waits for all world_size processes to connect: a missing task fails here, in time.
        # Under torchrun (and so colossalai run) the agent already serves a store on MASTER_PORT:
        # join it as a client, as torch's env:// rendezvous does, instead of listening on that port.
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(
            dist_env.master_addr,
            dist_env.master_port,
            dist_env.world_size,
            is_master=dist_env.rank == 0 and not agent,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=not agent,
        )
        # Always a PrefixStore: torch's c10d logger formats init_process_group's arguments, and
        # TCPStore's repr asks its socket for its addresses, which fails ("failed to format addr,
        # unknown family=0") in the network namespaces of tests/test_slurm_multinode.py (gVisor).
        attempt = f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}" if agent else "vitlarge"
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(attempt, store),
            rank=dist_env.rank,
            world_size=dist_env.world_size,
            timeout=datetime.timedelta(seconds=collective_timeout_s),
        )
        store.set_timeout(datetime.timedelta(seconds=collective_timeout_s))
        _KEEP_ALIVE.append(dist.group.WORLD)
    except (RuntimeError, dist.DistStoreError) as e:
        raise UserError(
            rendezvous_error(dist_env, e, time.monotonic() - t0, timeout_s, ifname), same_on_all_ranks=False
        ) from None


def rendezvous_error(dist_env: DistEnv, error: BaseException, elapsed_s: float, timeout_s: float, ifname: str) -> str:
    """The one line a failed rendezvous prints: master, this task's host and interface, the measured time;
    "did not complete within" only for a timeout (a store timeout, or the time spent reached the limit)."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    timed_out = "timed out" in first.lower() or "timeout" in first.lower() or elapsed_s >= 0.95 * timeout_s
    what = f"did not complete within {timeout_s:.0f}s" if timed_out else f"failed after {elapsed_s:.1f}s"
    return (
        f"rendezvous at {dist_env.master_addr}:{dist_env.master_port} {what} (rank {dist_env.rank} of "
        f"{dist_env.world_size}, {dist_env.source}; on {socket.gethostname()}, interface {ifname or 'default'}, "
        f"{elapsed_s:.1f}s): {first}; check that every process started and that the address is reachable"
    )


def quiet_imports() -> None:
    """Silences, before they are imported, warnings about optional parts a vitlarge run never uses.

    * Colossal-AI warns at import about optional CUDA extensions (tensornvme, apex).
    * Colossal-AI imports bitsandbytes (for its GaLore optimizers), whose CPU backend logs "Failed to
      load CPU gemm_4bit_forward from kernels-community" on CPUs with AVX512-BF16: 4-bit kernels
      vitlarge never calls. Only that module's logger is raised to ERROR.
    """
    import logging

    warnings.filterwarnings("ignore", message=".*(tensornvme|apex|kernels).*")
    warnings.filterwarnings("ignore", category=FutureWarning, module="colossalai")
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def launcher_rank(env=None) -> int | None:
    """This process's rank as its launcher set it (``RANK``, else ``SLURM_PROCID``; 0 without a
    launcher), read without validation; None when unreadable. Known before any process group."""
    env = os.environ if env is None else env
    key = "RANK" if "RANK" in env else "SLURM_PROCID" if "SLURM_PROCID" in env else None
    try:
        return int(env[key]) if key else 0
    except ValueError:
        return None


def prints_error(error: UserError, dist_env: DistEnv | None, group_exists: bool | None = None) -> bool:
    """Whether this process prints ``error``, so that an error every rank meets is printed once.

    See ``UserError.same_on_all_ranks``. Such an error is printed by rank 0 (the process that will
    be rank 0, before the process group exists); a rank-local one by the rank that raised it; a
    process that cannot tell its rank prints. ``group_exists`` defaults to torch.distributed's state."""
    if group_exists is None:
        dist = sys.modules.get("torch.distributed")  # not imported yet: no process group yet
        group_exists = dist is not None and dist.is_available() and dist.is_initialized()
    same = error.same_on_all_ranks if error.same_on_all_ranks is not None else not group_exists
    rank = dist_env.rank if dist_env is not None else launcher_rank()
    return not same or rank in (0, None)
