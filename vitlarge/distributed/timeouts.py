"""How long a rank waits in a collective, and the one line every rank ends with when the wait runs out.

Two timeouts (``train.init_timeout_s``, ``train.collective_timeout_s``; their reasons are in the schema): the
process group is created with the first (`vitlarge.run.job.build_run`), and the trainer lowers it to the
second once a phase's first step has completed (`set_collective_timeout`) and raises it again where the next
phase rebuilds its loaders. torch's ``_set_pg_timeout`` changes the group's default timeout in place, for gloo
and NCCL alike; each collective reads it when it starts.

Under gloo a collective that runs out raises ``RuntimeError("... Timed out waiting 3000ms for recv ...")`` in
the rank that waited, and its peers, once it has left, ``"... Connection closed by peer ..."``. `collective_failure`
turns either into one line naming the collective (read from the traceback) and, after a short roll call through
the rendezvous store, the ranks that did not report it. Under NCCL the watchdog thread aborts the process
instead (SIGABRT, status 134) with its own line ``Watchdog caught collective operation timeout: WorkNCCL(SeqNum=..,
OpType=ALLREDUCE, ...)``; that path is out of Python's reach and untested here (no GPU).
"""

from __future__ import annotations

import datetime
import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from vitlarge.errors import EXIT_COLLECTIVE_TIMEOUT

_timeout_s: list[float] = [0.0]  # the group's timeout as last set here (what a timed-out collective waited)

ROLL_CALL_S = 10.0
"""The longest a rank whose collective failed waits for the others to report theirs (less when the timeout is)."""

_PACKAGE = Path(__file__).resolve().parents[1]


def set_collective_timeout(seconds: float) -> None:
    """Every later collective of the default group (and its store's calls) waits at most ``seconds``."""
    import torch.distributed as dist  # lazy: keeps torch off train.py until the thread pools are sized

    if not dist.is_initialized():
        return
    if _timeout_s[0] == seconds:
        return
    timeout = datetime.timedelta(seconds=seconds)
    dist.distributed_c10d._set_pg_timeout(timeout)
    dist.distributed_c10d._get_default_store().set_timeout(timeout)
    _timeout_s[0] = seconds


def record_timeout(seconds: float) -> None:
    """What the group was created with (`vitlarge.distributed.process.init_distributed`)."""
    _timeout_s[0] = seconds


@dataclass(frozen=True)
class CollectiveFailure:
    line: str
    """One line: the collective, this rank, what gloo said, who did not report it, and what to change."""
    status: int
    """`EXIT_COLLECTIVE_TIMEOUT` for the rank that waited too long; 1 for one whose peer left (the cause is
    elsewhere: that rank's own status, a crash's 134 or 139 included, is the one to read)."""


def collective_failure(error: BaseException) -> CollectiveFailure | None:
    """The line and status for ``error`` when it is a collective that timed out or lost its peer; None otherwise.
    Called on the error path only: it talks to the other ranks through the rendezvous store (bounded)."""
    import torch.distributed as dist  # lazy: keeps torch off train.py until the thread pools are sized

    if not isinstance(error, RuntimeError) or not dist.is_initialized():
        return None
    said = _gloo_line(str(error))
    timed_out = "Timed out waiting" in said
    if not timed_out and "Connection closed by peer" not in said and "Connection reset by peer" not in said:
        return None
    op = operation(error)
    rank, world = dist.get_rank(), dist.get_world_size()
    waited = _timeout_s[0]
    if not timed_out:
        return CollectiveFailure(
            f"{op} failed on rank {rank} of {world}: another rank left the process group (gloo: {said}); that "
            "rank's own line says why",
            1,
        )
    grace = min(ROLL_CALL_S, waited or ROLL_CALL_S)
    missing = roll_call(rank, world, grace)
    if missing is None:
        who = "which rank did not arrive cannot be told (the rendezvous store did not answer)"
    elif missing:
        names = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {', '.join(map(str, missing))}"
        who = (
            f"{names} did not report it within {grace:.0f}s: never reached this collective (stalled or hung), or "
            "waits in it for another rank"
        )
    else:
        who = "every rank timed out in it"
    after = f" after {waited:.0f}s" if waited else ""
    return CollectiveFailure(
        f"{op} timed out on rank {rank} of {world}{after} (gloo: {said}); {who}; if that rank was only slow "
        "(a checkpoint write, a compile, a data stall), raise train.collective_timeout_s (train.init_timeout_s "
        "until each phase's first step, and in evaluations and checkpoints)",
        EXIT_COLLECTIVE_TIMEOUT,
    )


def roll_call(rank: int, world: int, grace_s: float) -> list[int] | None:
    """Says through the rendezvous store that this rank's collective failed and waits (at most ``grace_s``) for
    the others to say it too; returns those that did not, or None when the store does not answer (its host,
    rank 0 or the launcher's agent, is gone or frozen). Every rank stuck in the same collective times out
    within the skew of their arrivals, so a rank missing after ``grace_s`` is, as a rule, one that never came."""
    import torch.distributed as dist  # lazy: keeps torch off train.py until the thread pools are sized

    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=grace_s + 5))
        store.set(f"vitlarge_failed/{rank}", "1")
        deadline = time.monotonic() + grace_s
        while True:
            missing = [r for r in range(world) if not store.check([f"vitlarge_failed/{r}"])]
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(0.2)
    except Exception:  # noqa: BLE001 - a store that cannot answer leaves the question open, not the line unsaid
        return None


def operation(error: BaseException) -> str:
    """The collective ``error`` came from, from its traceback: torch.distributed's function that the run called
    (``all_reduce``, ``broadcast_object_list``), DDP's gradient all-reduce where the error came out of a backward
    pass, else the innermost torch function (DDP's forward broadcasts from C++: ``a collective in
    torch/nn/parallel/distributed.py:forward``); with the innermost vitlarge function that called it
    (``all_reduce (vitlarge/train/loop.py:_sync)``)."""
    frames = traceback.extract_tb(error.__traceback__)
    paths = [f.filename.replace("\\", "/") for f in frames]
    c10d = [f.name for f, p in zip(frames, paths) if p.endswith("distributed_c10d.py") and f.name != "wrapper"]
    backward = any(p.endswith(("torch/autograd/__init__.py", "torch/_tensor.py")) for p in paths)
    in_torch = [f"torch/{p.rsplit('/torch/', 1)[1]}:{f.name}" for f, p in zip(frames, paths) if "/torch/" in p]
    if c10d:
        what = c10d[0]
    elif backward:
        what = "DDP's gradient all-reduce"
    else:
        what = f"a collective in {in_torch[-1]}" if in_torch else "a collective"
    ours = [f for f in frames if _is_ours(f.filename)]
    if not ours:
        return what
    f = ours[-1]
    return f"{what} ({Path(f.filename).resolve().relative_to(_PACKAGE.parent)}:{f.name})"


def _is_ours(filename: str) -> bool:
    path = Path(filename).resolve()
    return path.is_relative_to(_PACKAGE) and path.name not in ("timeouts.py", "process.py")


def _gloo_line(message: str) -> str:
    """gloo's first line without torch's wrapping and gloo's source location (``Got the following error when running
    the callback: RuntimeError: [.../unbound_buffer.cc:78] Timed out ...``: ``Timed out ...``)."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return re.split(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", first)[-1]
