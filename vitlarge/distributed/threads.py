"""Thread budgets: how many threads this process's PyTorch, OpenMP and DALI pools get.

Sized from the CPUs this process may use and how many processes share its node (the launcher's
``LOCAL_WORLD_SIZE``, Slurm's tasks per node), before torch is imported: libgomp and OpenBLAS size
their pools at first import.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import NamedTuple

from vitlarge.distributed.launcher import int_env
from vitlarge.errors import UserError
from vitlarge.text import plural


class ThreadPools(NamedTuple):
    """What `size_thread_pools` set: PyTorch's intra-op threads per process, and why (the line rank 0 logs)."""

    size: int
    why: str


NO_THREADS = ThreadPools(0, "")
"""A process that did not size its pools (a test's, a tool's): nothing to log."""


def _slurm_counts(env: Mapping[str, str], key: str) -> list[int]:
    """A Slurm per-node count list (``"2(x3),1"``: 2 on each of the first 3 nodes, 1 on the fourth)."""
    counts = []
    for part in env[key].split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise UserError(f"environment variable {key}={env[key]!r} is not a Slurm per-node count list")
        counts += [int(m[1])] * int(m[2] or 1)
    return counts


def _node_entry(env: Mapping[str, str], key: str) -> int | None:
    """This node's entry (``SLURM_NODEID``) of the count list ``key``; None when unset or out of range
    (heterogeneous steps; the job-level lists are indexed by job nodes, SLURM_NODEID by step nodes)."""
    if not env.get(key):
        return None
    counts = _slurm_counts(env, key)
    node = int_env(env, "SLURM_NODEID") if env.get("SLURM_NODEID") else 0
    return counts[node] if node < len(counts) else None


def _tasks_on_this_node(env: Mapping[str, str]) -> tuple[int, str] | None:
    """How many tasks of this job step share this node, from the launcher's variables (None: unknown).

    Slurm: ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` indexed by ``SLURM_NODEID``; if the
    node is not in the list, the step's average rounded up (``SLURM_STEP_NUM_TASKS`` / ``SLURM_STEP_NUM_NODES``,
    never "one task": that would give every task the whole node); else ``SLURM_NTASKS_PER_NODE``.
    torchrun: ``LOCAL_WORLD_SIZE``."""
    if "LOCAL_WORLD_SIZE" in env:
        return int_env(env, "LOCAL_WORLD_SIZE"), "LOCAL_WORLD_SIZE"
    listed = [k for k in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if env.get(k)]
    for key in listed:
        n = _node_entry(env, key)
        if n is not None:
            return n, key
    for tasks, nodes in (("SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES"), ("SLURM_NTASKS", "SLURM_NNODES")):
        if env.get(tasks) and env.get(nodes) and int_env(env, nodes) >= 1:
            return -(-int_env(env, tasks) // int_env(env, nodes)), f"{tasks} / {nodes}, rounded up"
    if env.get("SLURM_NTASKS_PER_NODE"):
        return int_env(env, "SLURM_NTASKS_PER_NODE"), "SLURM_NTASKS_PER_NODE"
    if listed:  # a list that does not cover this node and nothing to average: the largest entry
        return max(_slurm_counts(env, listed[0])), f"{listed[0]}, largest entry"
    return None


def _bound_per_task(env: Mapping[str, str], usable_cpus: int) -> bool:
    """Whether Slurm already bound this task to its own CPUs (task/affinity or task/cgroup with
    ``--cpu-bind=cores`` etc.): the mask is then this task's share, not the node's."""
    bind = env.get("SLURM_CPU_BIND_TYPE", "").strip().lower()
    if bind and not bind.startswith("none"):
        return True
    allocated = _node_entry(env, "SLURM_JOB_CPUS_PER_NODE") if env.get("SLURM_JOB_CPUS_PER_NODE") else None
    return allocated is not None and usable_cpus < allocated


def cpu_share(env: Mapping[str, str], usable_cpus: int) -> tuple[int, str]:
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
        n = int_env(env, "SLURM_CPUS_PER_TASK")
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
    return max(
        1, usable_cpus // tasks[0]
    ), f"{usable_cpus} usable CPUs / {plural(tasks[0], 'task')} on this node ({tasks[1]})"


def thread_budget(env: Mapping[str, str], usable_cpus: int) -> tuple[int, str]:
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


def dali_threads(env: Mapping[str, str], usable_cpus: int) -> tuple[int, str]:
    """DALI's default ``num_threads`` (recipe ``data.num_threads=0``): the process's ``cpu_share``, never
    ``OMP_NUM_THREADS`` (torchrun's blanket 1 would leave one decode/read thread per GPU). Where the share
    is 4 CPUs or more this is at least the old fixed default of 4; below that the share wins, since more
    DALI threads than CPUs only fight PyTorch's for them. Pure."""
    return cpu_share(env, usable_cpus)


def size_thread_pools(env: Mapping[str, str] | None = None) -> ThreadPools:
    """Sizes PyTorch's intra-op pool and ``OMP_NUM_THREADS`` by ``thread_budget``; imports no torch, so that
    train.py calls it before torch loads (PyTorch then takes the size from ``OMP_NUM_THREADS``).

    Without it every srun task runs a pool as large as the node, and N tasks fight for the cores
    (the issue-16 measurement: 2 srun tasks on 2 cores trained 3x slower than colossalai run, which
    exports OMP_NUM_THREADS=1). Returns ``thread_budget``'s threads and why for the caller to log once
    (rank 0), after the config checks, so that bad input stays one line; the budget is also DALI's
    default ``data.num_threads`` (``vitlarge.data.sources``)."""
    env = os.environ if env is None else env
    n, why = thread_budget(env, len(os.sched_getaffinity(0)))
    # Best before torch (and with it libgomp, OpenBLAS) is first imported: they size their pools from
    # OMP_NUM_THREADS when they load. set_num_threads covers a torch that is already loaded.
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    return ThreadPools(n, why)
