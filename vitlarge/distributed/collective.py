"""Decisions that every rank shares: rank 0 decides and tells the others, or every rank reports and all see all.

Checkpoint code takes no file-system decision on a rank alone: on a shared file system with
attribute caching (NFS, Lustre clients on several nodes) ranks can list different folders, and a
decision that starts a collective (which checkpoint to load, whether to write a final one) must be
the same everywhere or the run hangs. Every function here is a collective (all ranks call it, in
the same order) and also works without a process group (one process).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch.distributed as dist

from vitlarge.errors import UserError

T = TypeVar("T")


def rank_and_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank0_decides(decide: Callable[[], T]) -> T:
    """Runs ``decide`` on rank 0 only and returns its (picklable) result on every rank.

    A ``UserError`` raised by ``decide`` is raised on every rank (same message, printed once). Any
    other exception is re-raised on rank 0 with its traceback, and the other ranks end with a
    one-line ``UserError`` that points there, so that nobody waits for a decision that never comes.
    """
    rank, world = rank_and_world()
    if world == 1:
        return decide()
    message: list[Any] = [None, None]  # (result, error text) from rank 0
    failure = None
    if rank == 0:
        try:
            message[0] = decide()
        except UserError as e:
            message[1] = str(e)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the others heard of it
            failure = e
            first = (str(e).strip().splitlines() or [""])[0]
            message[1] = f"rank 0 failed ({type(e).__name__}: {first}); see its traceback"
    dist.broadcast_object_list(message, src=0)
    if failure is not None:
        raise failure
    if message[1] is not None:
        raise UserError(message[1], same_on_all_ranks=True)
    return message[0]


def agree(check: Callable[[], T]) -> T:
    """Runs ``check`` on every rank and returns its result; a ``UserError`` on any rank stops every rank
    here, within one collective, instead of leaving the others to wait in the next one.

    Who prints what (``UserError.same_on_all_ranks``): an error every rank met alike is printed once, by
    rank 0; otherwise each rank that met one prints it, naming itself and its host (a data path missing
    on one node), and rank 0, if it met none, prints one line naming the lowest such rank and its error.
    Any other exception (an ``OSError`` such as NFS's ESTALE) is reported to the others the same way and
    re-raised, with its traceback, on the rank that met it.
    """
    rank, world = rank_and_world()
    if world == 1:
        return check()
    result: T | None = None
    problem: str | None = None
    failure: Exception | None = None
    try:
        result = check()
    except UserError as e:
        problem = str(e)
    except Exception as e:  # noqa: BLE001 - re-raised below, after the others heard of it
        failure = e
        first = (str(e).strip().splitlines() or [""])[0]
        problem = f"{type(e).__name__}: {first} (see its traceback)"
    reports = gather((problem, socket.gethostname()))
    if failure is not None:
        raise failure
    failed = [(r, p, host) for r, (p, host) in enumerate(reports) if p is not None]
    if not failed:
        return cast(T, result)  # check() returned on this rank
    if problem is not None and len(failed) == world and len({p for _, p, _ in failed}) == 1:
        raise UserError(problem, same_on_all_ranks=True)
    if problem is not None:
        raise UserError(f"rank {rank} on {reports[rank][1]}: {problem}", same_on_all_ranks=False)
    r, p, host = failed[0]
    raise UserError(f"rank {r} on {host} stopped the run: {p}", same_on_all_ranks=True)


def check_same(value: str, what: str, fix: str) -> None:
    """Every rank passes its ``value`` (a short, comparable description); when they differ, every rank raises
    one ``UserError`` naming the first rank that differs from rank 0, both hosts and both values. For what each
    rank derives from its own view of shared input (the data set's manifest): checks that pass on every rank
    can still disagree between ranks, and the run would then diverge or deadlock much later."""
    reports = gather((value, socket.gethostname()))
    differ = next((r for r, (v, _) in enumerate(reports) if v != reports[0][0]), None)
    if differ is None:
        return
    (v0, host0), (v, host) = reports[0], reports[differ]
    raise UserError(
        f"the ranks see different {what}: rank 0 on {host0}: {v0}; rank {differ} on {host}: {v}; {fix}",
        same_on_all_ranks=True,
    )


def first_failure(problem: str | None) -> tuple[int, str] | None:
    """Every rank passes what went wrong on it (None: nothing); all return the lowest failing rank and its text."""
    return next(((r, p) for r, p in enumerate(gather(problem)) if p is not None), None)


def gather(value: T) -> list[T]:
    """Every rank's ``value``, in rank order, on every rank."""
    _, world = rank_and_world()
    if world == 1:
        return [value]
    values: list[Any] = [None] * world
    dist.all_gather_object(values, value)
    return values
