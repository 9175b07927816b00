"""What the commands that train or evaluate a model share: the start of a process (`start`) and the guard that
turns how it ended into its exit status and one line (`exit_status`). `vitlarge.run.cli` (train.py) and
`vitlarge.evaluate` call both, so a device, precision or determinism choice and an error's line are the same in
each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vitlarge.config.schema import Config
from vitlarge.distributed import launcher, process
from vitlarge.distributed.launcher import DistEnv
from vitlarge.distributed.quiet import gloo_connected_lines_dropped
from vitlarge.distributed.threads import NO_THREADS, ThreadPools
from vitlarge.distributed.timeouts import collective_failure
from vitlarge.errors import EXIT_NAN_GUARD, Preempted, UserError
from vitlarge.events import StopTraining

if TYPE_CHECKING:  # torch: `exit_status` runs before it loads (the thread pools are sized first)
    from vitlarge.train.settings import Settings


@dataclass(frozen=True)
class Started:
    """A process `start` set up: its settings, and the line a CUDA run logs about determinism ("" on CPU)."""

    settings: Settings
    determinism: str


def start(
    cfg: Config,
    env: DistEnv,
    threads: ThreadPools = NO_THREADS,
    *,
    before_group: Callable[[Settings], None] | None = None,
    collective_timeout_s: float = 300.0,
) -> Started:
    """In this order: the device and backend (``train.device``, `vitlarge.distributed.process.choose_device`),
    every device-dependent setting (`vitlarge.train.settings.resolve_settings`; a missing compile toolchain
    stops here, before the process group), determinism (before the first CUDA kernel: cuBLAS reads its
    workspace setting once), ``before_group(settings)`` (what the caller does before the rendezvous), then the
    process group, its collectives waiting ``collective_timeout_s``. ``threads``: `size_thread_pools`'s."""
    from vitlarge.train.settings import (  # lazy: keeps torch off train.py until the thread pools are sized
        apply_determinism,
        resolve_settings,
    )

    device, backend = process.choose_device(cfg.train.device, env.local_rank)
    settings = resolve_settings(cfg, device, backend, threads)
    determinism = apply_determinism(cfg.train.deterministic, settings.device)
    if before_group is not None:
        before_group(settings)
    with gloo_connected_lines_dropped():  # gloo's "[Gloo] Rank r is connected to ..." on every rank
        process.init_distributed(env, settings.backend, collective_timeout_s=collective_timeout_s)
    return Started(settings, determinism)


def exit_status(work: Callable[[DistEnv], int]) -> int:
    """``work(env)`` with this process's launcher environment; its status, or how it stopped as a status and
    one line on stderr (also recorded for torchrun's summary, `vitlarge.distributed.process.tell_launcher`):

    * bad input (`UserError`): 2, ``error: <message>``, printed once (by rank 0 for an error every rank meets; a
      rank that fails alone before the process group names itself and stops the others:
      `vitlarge.distributed.process.report_before_group`); a failed rendezvous (`RendezvousFailed`) the same way,
      with 69: not bad input, a restart may succeed;
    * the NaN guard (`StopTraining`): 3, ``error: <message>`` from the main rank;
    * a checkpoint on a signal (`Preempted`): 75, or 130 on Ctrl-C, ``vitlarge: <message>`` from the main rank (on
      the stream ``colossalai run`` wrote to where a SIGTERM to its group ended it first:
      `vitlarge.distributed.launcher.keep_colossalai_run_stderr`);
    * a collective that timed out or lost its peer: its status (124 on gloo), one line per rank
      (`vitlarge.distributed.timeouts.collective_failure`). Any other error propagates."""
    env = None
    try:
        env = launcher.detect()
        if env.is_main:  # its stop line has a reader after a SIGTERM that ended colossalai run
            launcher.keep_colossalai_run_stderr()
        return work(env)
    except UserError as e:
        # The launcher's summary repeats the line (torchrun's error file).
        process.tell_launcher(f"error: {e}", e.exit_status)
        if process.report_before_group(e, env):  # once; a rank's own error named by it (and told to the others)
            process.say(f"error: {e}")
        return e.exit_status
    except StopTraining as e:
        process.tell_launcher(f"error: {e}", EXIT_NAN_GUARD)
        if env is None or env.is_main:
            process.say(f"error: {e}")
        return EXIT_NAN_GUARD
    except Preempted as e:
        process.tell_launcher(f"vitlarge: {e}", e.exit_status)
        if (env is None or env.is_main) and not process.say(f"vitlarge: {e}") and not e.interrupted:
            launcher.say_after_colossalai_run(f"vitlarge: {e}")
        if e.interrupted and env is not None and env.local_rank == 0:
            launcher.release_colossalai_run_after_ctrl_c()
        return e.exit_status
    except RuntimeError as e:  # a collective that timed out (or lost its peer): one line per rank, its own status
        failure = collective_failure(e)
        if failure is None:
            raise
        process.tell_launcher(f"error: {failure.line}", failure.status)
        process.say(f"error: {failure.line}")
        return failure.status
