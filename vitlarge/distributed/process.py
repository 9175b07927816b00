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

import ctypes
import datetime
import importlib.util
import json
import logging
import os
import socket
import sys
import time
import traceback
import types
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NoReturn

from vitlarge.distributed import timeouts
from vitlarge.distributed.launcher import DistEnv, launcher_rank
from vitlarge.distributed.network import bind_interface
from vitlarge.errors import EXIT_INTERRUPTED, RendezvousFailed, UserError

if TYPE_CHECKING:  # torch loads after the thread budgets are set (vitlarge.distributed.threads)
    import torch
    import torch.distributed

GPU_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "SLURM_GPUS_ON_NODE",
    "SLURM_GPUS_PER_NODE",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
)
"""What says that a process has GPUs: CUDA's mask (which torchrun and ``colossalai run`` pass on from the node, and
srun sets from the job's GPUs) and what srun sets for ``--gpus-per-node`` / ``--gres=gpu:N`` / the GPUs given."""


def gpus_asked_for(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The first of `GPU_VARIABLES` that names GPUs, and its value; None when none does. Hidden on purpose
    (``CUDA_VISIBLE_DEVICES`` empty, ``-1``, ``none``, only commas; Slurm's ``NoDevFiles``) or counts that add up
    to 0 (``0``, ``a100:0,v100:0``) name none; GPU 0 is one, and a count this cannot read (``gpu:4(IDX:0-3)``)
    is taken as GPUs."""
    env = os.environ if env is None else env
    for name in GPU_VARIABLES:
        value = env.get(name, "").strip()
        items = [item.strip() for item in value.split(",") if item.strip()]
        if not items or value.lower() in ("nodevfiles", "none") or items[0] == "-1":  # CUDA stops at a bad id
            continue
        if name in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):  # counts ("4", "h100:8", "a100:4,v100:0")
            counts = [item.split("(")[0].rpartition(":")[2] for item in items]
            if all(c.isdigit() for c in counts) and sum(map(int, counts)) == 0:
                continue
        return name, value
    return None


def choose_device(requested: str = "auto", local_rank: int = 0) -> tuple[torch.device, str]:
    """The one place that maps the config's ``train.device`` to a torch device and a backend.

    ``auto`` takes the CPU only where nothing asked for GPUs (`gpus_asked_for`): a job step that was given GPUs
    and sees none (a wrong ``--gpus-per-node``, a container without its GPUs, a CPU-only torch) stops here,
    before the rendezvous, instead of training on gloo at a few images per second."""
    import torch  # lazy: keeps torch off train.py until the thread pools are sized

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
    asked = gpus_asked_for() if requested == "auto" else None
    if asked:
        why = "this torch is built without CUDA" if torch.version.cuda is None else "CUDA's driver sees no device"
        raise UserError(
            f"train.device=auto found no CUDA GPU, but {asked[0]}={asked[1]} says this job has GPUs ({why}); "
            "give the job step its GPUs (srun --gpus-per-node, a container's --gpus / --nv), or pass "
            "train.device=cpu to train on the CPU anyway",
            same_on_all_ranks=False,
        )
    return torch.device("cpu"), "gloo"


RENDEZVOUS_TIMEOUT_ENV = "VITLARGE_RENDEZVOUS_TIMEOUT"
"""Seconds to wait for every process to join: a missing task fails the run after this. Unset, train.py waits
``train.init_timeout_s`` (the tools and tests 300 s); kept so that a job can bound the rendezvous alone."""
RENDEZVOUS_TIMEOUT_MAX_S = 7 * 24 * 3600
"""The longest rendezvous the variable may ask for: a week, longer than any job waits for its tasks."""


def rendezvous_timeout_s(env: Mapping[str, str] | None = None, default: float = 300.0) -> float:
    env = os.environ if env is None else env
    raw = env.get(RENDEZVOUS_TIMEOUT_ENV)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= RENDEZVOUS_TIMEOUT_MAX_S:  # nan, inf and 1e300 too: a timedelta cannot hold them
        raise UserError(
            f"environment variable {RENDEZVOUS_TIMEOUT_ENV}={raw[:40]!r} must be a positive number of seconds, "
            f"at most {RENDEZVOUS_TIMEOUT_MAX_S:,} (a week); unset it to wait train.init_timeout_s"
        )
    return value


# torch 2.5 deadlocks at exit, now and then, when the DDP Reducer drops the last reference to the
# gloo process group: ~ProcessGroupGloo joins its worker threads while holding the GIL, and a worker
# that is still releasing the tensors of the last all-reduce waits for the GIL (fixed upstream by
# "Release GIL in PG destructor", pytorch#154976). Holding a reference here moves the destruction
# to the end of the process, which `leave` makes os._exit. Seen as srun/torchrun never returning after
# "exported ...".
_KEEP_ALIVE: list = []


def leave(code: int) -> NoReturn:
    """Ends the process with ``code``: the last call of train.py and the multi-rank tools.

    A process that joined a process group leaves at once (``os._exit``) after flushing its log handlers, its
    Python streams and C's stdio buffers, whatever the code. Left to the interpreter's shutdown, the gloo group
    and its threads are torn down while the interpreter finalizes, and that can abort the process ("terminate
    called without an active exception", SIGABRT), so a run that finished and exported could end with 134 instead of
    0 (docs/RELIABILITY.md). The status is what torchrun, Slurm's
    requeue (75) and the user read, so it must not depend on the teardown.

    What ``os._exit`` skips is the interpreter's finalizers and ``atexit``: the run's own files are complete
    before (checkpoints and exports are written and renamed by then, the hooks have closed theirs in
    ``Hook.on_close`` on every way a run ends). With ``data.read_workers`` the workers end by their
    parent-death signal, and multiprocessing's resource tracker then removes their semaphores and says it did
    ("leaked semaphore objects"); with ``train.compile`` inductor's compile workers end on their own."""
    if _KEEP_ALIVE or _group_is_up():
        flushes = (logging.shutdown, sys.stdout.flush, sys.stderr.flush, lambda: ctypes.CDLL(None).fflush(None))
        for flush in flushes:
            try:
                flush()
            except (OSError, ValueError):  # a reader gone (srun's I/O, a killed `| tee`): the status still counts
                pass
        os._exit(code)
    sys.exit(code)


def say(line: str) -> bool:
    """``line`` on stderr, where a gone reader (srun's I/O, a killed ``| tee``) must not change the exit status;
    whether it was written."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        return False
    return True


def tell_launcher(line: str, status: int) -> None:
    """Records ``line`` as this worker's failure in torchrun's error file (``TORCHELASTIC_ERROR_FILE``, set by
    torchrun and so by ``colossalai run``): the launcher's summary then repeats it ("traceback : error: ...")
    instead of "To enable traceback see: https://pytorch.org/...". ``status`` (the exit status this process is
    about to leave with) and the rank go beside it for ``python -m vitlarge.run``, which reads them when the
    launcher itself was signalled and torchrun reports no exit codes (`vitlarge.run.supervisor`). No-op elsewhere."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return

    stamp = str(int(time.time()))
    doc = {
        "message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": stamp}},
        "exit_status": status,
        "rank": os.environ.get("RANK", "-1"),
    }
    try:
        with open(path, "w") as f:
            json.dump(doc, f)
    except OSError:  # the summary says less; the status and our own line are what count
        pass


def main_then_leave(main: Callable[[], int]) -> NoReturn:
    """``leave(main())``, also when ``main`` raises what it does not handle (a collective that timed out, a
    CUDA error, Ctrl-C): the traceback is printed and the process leaves with 1 (130 on Ctrl-C) the same way."""
    try:
        code = main()
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except Exception:
        try:
            traceback.print_exc()
        except (OSError, ValueError):
            pass
        code = 1
    leave(code)


def _group_is_up() -> bool:
    """Whether a process group is up, without importing torch.distributed (not imported yet: none is)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def init_distributed(
    dist_env: DistEnv, backend: str, timeout_s: float | None = None, collective_timeout_s: float = 300.0
) -> None:
    """Initialises the default process group (also for world size 1, so one code path).

    ``timeout_s`` bounds the rendezvous only (every process connected to the master's store);
    it defaults to ``$VITLARGE_RENDEZVOUS_TIMEOUT``, else ``collective_timeout_s``. Collectives, and store
    operations after the rendezvous, get ``collective_timeout_s`` (train.py: ``train.init_timeout_s``, lowered
    after step 1 by `vitlarge.distributed.timeouts.set_collective_timeout`): a short rendezvous timeout must not
    make a long checkpoint write on rank 0 look like a hang to the other ranks.
    """
    import torch.distributed as dist  # lazy: keeps torch off train.py until the thread pools are sized

    if dist.is_initialized():
        return
    if timeout_s is None:
        timeout_s = rendezvous_timeout_s(default=collective_timeout_s)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = dist_env.master_addr, str(dist_env.master_port)
    ifname = bind_interface(dist_env)
    if dist_env.local_rank == 0 and dist_env.source == "slurm" and dist_env.world_size > 1:
        logging.getLogger("vitlarge").info(
            f"rendezvous at {dist_env.master_addr}:{dist_env.master_port}, gloo interface on {socket.gethostname()}: "
            f"{ifname or '(gloo default)'}"
        )
    t0 = time.monotonic()
    try:
        # The master waits for all world_size processes to connect: a missing task fails here, in time.
        store, attempt = _rendezvous_store(dist_env, timeout_s, wait_for_workers=True)
        _all_started(dist.PrefixStore(f"{attempt}/{START}", store), dist_env, t0 + timeout_s, _this_gpu(backend))
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(attempt, store),
            rank=dist_env.rank,
            world_size=dist_env.world_size,
            timeout=datetime.timedelta(seconds=collective_timeout_s),
        )
        store.set_timeout(datetime.timedelta(seconds=collective_timeout_s))
        timeouts.record_timeout(collective_timeout_s)
        _KEEP_ALIVE.append(dist.group.WORLD)
    except (RuntimeError, dist.DistStoreError) as e:
        raise RendezvousFailed(
            rendezvous_error(dist_env, e, time.monotonic() - t0, timeout_s, ifname), same_on_all_ranks=False
        ) from None


def _this_gpu(backend: str) -> tuple[str, str] | None:
    """This host and the UUID of the CUDA device `choose_device` made current; None off CUDA."""
    if backend != "nccl":
        return None
    import torch  # lazy: keeps torch off train.py until the thread pools are sized

    return socket.gethostname(), str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


START = "vitlarge_start"  # the rendezvous store's keys where ranks say they started, or why they could not


def _rendezvous_store(
    dist_env: DistEnv, timeout_s: float, wait_for_workers: bool
) -> tuple[torch.distributed.TCPStore, str]:
    """The run's rendezvous store and the prefix of this attempt's keys. Under torchrun (and so colossalai
    run) the agent already serves a store on MASTER_PORT: join it as a client, as torch's env:// rendezvous
    does, instead of listening on that port. Always used through a PrefixStore: torch's c10d logger formats
    init_process_group's arguments, and TCPStore's repr asks its socket for its addresses, which fails
    ("failed to format addr, unknown family=0") in the network namespaces of tests/e2e/test_slurm_multinode.py."""
    import torch.distributed as dist  # lazy: keeps torch off train.py until the thread pools are sized

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        dist_env.master_addr,
        dist_env.master_port,
        dist_env.world_size,
        is_master=dist_env.rank == 0 and not agent,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=wait_for_workers and not agent,
    )
    attempt = f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}" if agent else "vitlarge"
    return store, attempt


class ToldByAnotherRank(UserError):
    """Another rank's error, heard through the rendezvous store: not reported back (`report_before_group`)."""


def _all_started(
    start: torch.distributed.Store, dist_env: DistEnv, deadline: float, gpu: tuple[str, str] | None = None
) -> None:
    """Waits (until ``deadline``: then a timeout, said as the rendezvous's) for every rank to have started,
    and stops at once, naming it, when a rank reports an error it met before the process group existed
    (`report_before_group`: a recipe, device or path missing on one node). ``gpu``: this rank's host and the UUID
    of its CUDA device; a second rank on the same GPU stops the run here (`_claim_gpu`)."""
    # A rank whose claim failed counts in "failed"; it must not count in "seen" too, or rank 0 (the store's host)
    # would stop waiting, and leave, before every other rank has heard.
    clashed = gpu is not None and _claim_gpu(start, dist_env.rank, *gpu)
    start.add("started", 1)
    if dist_env.rank == 0:  # a rank that failed waits for this (or rank 0's own error) to know who prints
        start.set("started/0", "1")
    while time.monotonic() < deadline:
        # "started" before "failed": a rank that fails at its start (`_claim_gpu`) counts as failed before it counts
        # as started, so a full count read first cannot hide its failure.
        everyone = start.add("started", 0) >= dist_env.world_size
        if start.add("failed", 0):
            if not clashed:
                start.add("seen", 1)
            # Rank 0 hosts the store: it stays until every rank has heard (bounded), or their next call fails.
            until = time.monotonic() + 10
            while dist_env.rank == 0 and time.monotonic() < until:
                if start.add("seen", 0) + start.add("failed", 0) >= dist_env.world_size:
                    break
                time.sleep(0.1)
            for r in range(dist_env.world_size):
                if start.check([f"error/{r}"]):
                    host, _, message = start.get(f"error/{r}").decode().partition("\n")
                    raise ToldByAnotherRank(
                        f"rank {r} on {host} stopped the run before the rendezvous: {message}", same_on_all_ranks=True
                    )
        if everyone:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{start.add('started', 0)}/{dist_env.world_size} processes started")


def _claim_gpu(start: torch.distributed.Store, rank: int, host: str, uuid: str) -> bool:
    """Records that ``rank`` on ``host`` uses the GPU ``uuid``; when another rank did first, reports the clash as
    this rank's error before the group (`_all_started` then stops every rank with it) and returns True. A UUID names one GPU
    wherever it is, so this refuses exactly what NCCL would ("Duplicate GPU detected") at the first collective,
    whatever the launcher: torchrun's ranks see every GPU and take their local rank's, srun --gpus-per-task=1
    gives each task another device 0, and a wrapper may set CUDA_VISIBLE_DEVICES itself."""
    key = f"gpu/{uuid}"
    n = start.add(key, 1)
    start.set(f"{key}/{n}", f"{rank}\n{host}")
    if n == 1:
        return False
    other, _, other_host = start.get(f"{key}/1").decode().partition("\n")
    low, high = sorted((int(other), rank))
    where = host if other_host == host else f"{other_host} and {host}"
    message = (
        f"ranks {low} and {high} on {where} would both use the GPU {uuid}; start one process per GPU (torchrun "
        "--nproc_per_node or srun --ntasks-per-node equal to the node's GPUs, or srun --gpus-per-task=1)"
    )
    start.set(f"error/{rank}", f"{host}\n{message}")
    start.add("failed", 1)
    return True


def report_before_group(error: UserError, dist_env: DistEnv | None) -> bool:
    """A rank that meets ``error`` before the process group exists tells the others through the rendezvous
    store, so that they stop within a second naming it (`_all_started`) instead of waiting out the
    rendezvous and blaming the network. Returns whether this process prints ``error``: rank 0 does (the
    usual case is an error every rank meets: a bad override), another rank prints its own, naming itself and
    its host, unless rank 0 reported one too. Without a usable store, `prints_error` decides."""
    group_exists = _group_is_up()
    told = isinstance(error, ToldByAnotherRank)
    if dist_env is None or dist_env.world_size == 1 or group_exists or error.same_on_all_ranks is False or told:
        return prints_error(error, dist_env)
    import torch.distributed as dist  # lazy: keeps torch off train.py until the thread pools are sized

    rank0_failed, told = False, False
    try:
        wait = min(30.0, rendezvous_timeout_s())
        # A client counts itself in (wait_for_workers) so the master's own wait for all workers ends; the
        # master (rank 0) does not wait for the others to report what it can tell them.
        store, attempt = _rendezvous_store(dist_env, wait, wait_for_workers=dist_env.rank != 0)
        start = dist.PrefixStore(f"{attempt}/{START}", store)
        start.set(f"error/{dist_env.rank}", f"{socket.gethostname()}\n{error}")
        if dist_env.rank == 0:  # it hosts the store: up until every other rank has heard or reported (bounded)
            start.add("failed", 1)
            deadline = time.monotonic() + wait
            while (
                time.monotonic() < deadline and start.add("seen", 0) + start.add("acked", 0) < dist_env.world_size - 1
            ):
                time.sleep(0.2)
            return True
        # Rank 0 either fails too (the same error, as a rule: then it prints, once) or reaches the rendezvous.
        deadline = time.monotonic() + wait
        while not start.check(["error/0"]) and not start.check(["started/0"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        rank0_failed = start.check(["error/0"])
        start.add("failed", 1)
        told = True
        start.add("acked", 1)
    except Exception:  # noqa: BLE001 - no store to tell (or rank 0 heard and left): say it here
        if not told:
            return prints_error(error, dist_env)
    if rank0_failed:
        return False
    error.args = (f"rank {dist_env.rank} on {socket.gethostname()}: {error}",)
    return True


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
    """Silences, before they are imported, optional parts a vitlarge run never uses: their warnings, and W&B's import.

    * Colossal-AI warns at import about optional CUDA extensions (tensornvme, apex).
    * Colossal-AI imports bitsandbytes (for its GaLore optimizers), whose CPU backend logs "Failed to
      load CPU gemm_4bit_forward from kernels-community" on CPUs with AVX512-BF16: 4-bit kernels
      vitlarge never calls. Only that module's logger is raised to ERROR. (A run imports neither where it
      can: `vitlarge.distributed.booster`.)
    * timm imports W&B at its own import where W&B is installed (``timm.utils.summary``, for its train.py's
      ``--log-wandb``), 1-2 s of CPU on a run's path to its first step with ``log.wandb`` off. W&B becomes a lazy
      module (`_LazyModule`): ``import wandb`` binds it, the first name read from it runs the import
      (``log.wandb=true``: hooks/wandb.py, before the first step, on the main thread).
    """
    warnings.filterwarnings("ignore", message=".*(tensornvme|apex|kernels).*")
    warnings.filterwarnings("ignore", category=FutureWarning, module="colossalai")
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    _import_lazily("wandb")


def _import_lazily(name: str) -> None:
    """``name`` in ``sys.modules`` as a module whose import runs when a name is first read from it (`_LazyModule`);
    nothing where it is imported already or not installed."""
    if name in sys.modules:
        return
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _LazyModule
    sys.modules[name] = module


class _LazyModule(types.ModuleType):
    """A module not run yet: its spec's attributes (``__file__``, ``__path__``, which scans of ``sys.modules`` such as
    `inspect.getmodule` read: importlib's `LazyLoader` would import on those) are there, and the first other name
    read runs its import in place; a failed import leaves ``sys.modules`` as a failed import does."""

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__") and attr not in ("__version__", "__all__"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        self.__class__ = types.ModuleType  # pyright: ignore[reportAttributeAccessIssue] (a plain module from here on)
        spec = self.__spec__
        assert spec is not None and spec.loader is not None
        try:
            spec.loader.exec_module(self)
        except BaseException:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            raise
        return getattr(self, attr)


def prints_error(error: UserError, dist_env: DistEnv | None, group_exists: bool | None = None) -> bool:
    """Whether this process prints ``error``, so that an error every rank meets is printed once.

    See ``UserError.same_on_all_ranks``. Such an error is printed by rank 0 (the process that will
    be rank 0, before the process group exists); a rank-local one by the rank that raised it; a
    process that cannot tell its rank prints. ``group_exists`` defaults to torch.distributed's state."""
    if group_exists is None:
        group_exists = _group_is_up()
    same = error.same_on_all_ranks if error.same_on_all_ranks is not None else not group_exists
    rank = dist_env.rank if dist_env is not None else launcher_rank()
    return not same or rank in (0, None)
