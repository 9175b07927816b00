"""The one exception type for bad input a user can fix.

Contract: the message is a single line that names the file or config key at fault and says how to
fix it. Entry points (train.py, data_tools, vitlarge.evaluate) print it as ``error: <message>`` and
exit with status 2 (its ``exit_status``; 69 for `RendezvousFailed`), without a traceback: `cli_main` for the
single-process tools; train.py and vitlarge.evaluate share `vitlarge.train.command.exit_status`, which also maps exit
statuses 3 (NaN guard) and 75 (preempted).
Every exit status vitlarge chooses is named here (``EXIT_*``), and used by its name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class UserError(Exception):
    """Bad input: a missing file, a wrong key, a value out of range. Message names it and the fix.

    ``same_on_all_ranks`` says who prints it (``vitlarge.distributed.process.prints_error``): True when every rank
    raises this same error (agreed through a collective, or computed from input all ranks read alike),
    so that only rank 0 prints it; False when it concerns this process alone; None (the default)
    decides by when it is raised: before the process group exists every process reads the same
    config and files (True), after it a rank may fail alone (False).
    """

    def __init__(self, message: str, *, same_on_all_ranks: bool | None = None):
        super().__init__(message)
        self.same_on_all_ranks = same_on_all_ranks

    @property
    def exit_status(self) -> int:
        """The status the process leaves with after printing the line: `EXIT_BAD_INPUT`."""
        return EXIT_BAD_INPUT


class RendezvousFailed(UserError):
    """The rendezvous did not complete: the processes did not all arrive within the timeout, or the master could
    not be reached. Said as a `UserError` is (one line naming the master, host and time), but not bad input: a
    peer pod still Pending, a slow image pull or a network blip ends here too, and the same command started again
    may succeed; so its status is `EXIT_RENDEZVOUS`, which a controller may restart (scripts/k8s/trainjob.yaml
    fails the job on 2 only)."""

    @property
    def exit_status(self) -> int:
        return EXIT_RENDEZVOUS


EXIT_BAD_INPUT = 2
"""Exit status for bad input a user can fix (`UserError`): one line ``error: <message>`` said what to fix."""

EXIT_NAN_GUARD = 3
"""Exit status after the NaN guard stopped training (``train.nan_patience`` non-finite losses in a row)."""

EXIT_RENDEZVOUS = 69
"""Exit status after a failed rendezvous (`RendezvousFailed`; sysexits' EX_UNAVAILABLE): the peers did not all
arrive in time, or the master was unreachable. One line ``error: rendezvous at HOST:PORT ...`` said where and how
long; starting again may succeed, unlike after bad input (2)."""

EXIT_PREEMPTED = 75
"""Exit status after a checkpoint on SIGTERM/SIGUSR1 (EX_TEMPFAIL): run the same command again to continue."""

EXIT_INTERRUPTED = 130
"""Exit status after a checkpoint on Ctrl-C (SIGINT; 128 + 2, what a shell reports for an interrupted command):
the user stopped the run, so a requeue script keyed on 75 does not restart it. Run the same command to continue."""


EXIT_COLLECTIVE_TIMEOUT = 124
"""Exit status of a rank whose collective timed out (train.collective_timeout_s; `vitlarge.distributed.timeouts`):
a stalled or hung rank, not a crash (1 with a traceback, 134 / 139 for SIGABRT / SIGSEGV) and not bad input (2).
124 is what coreutils' ``timeout`` returns for a command that ran out of time; ``srun`` and ``sacct`` show it (so
``timeout 23h train.py`` returns 124 for its own SIGTERM too: read the run's last line there). Under gloo only:
under NCCL the watchdog aborts the process (134) with NCCL's own line, out of Python's reach."""


class Preempted(Exception):
    """Training stopped at an optimizer-step boundary on a signal, after writing a checkpoint. ``interrupted``:
    the signal was Ctrl-C's SIGINT (exit `EXIT_INTERRUPTED`), else a scheduler's (exit `EXIT_PREEMPTED`)."""

    def __init__(self, step: int, path: str | os.PathLike[str], interrupted: bool = False):
        what = "interrupted (Ctrl-C)" if interrupted else "stopped on signal"
        super().__init__(f"{what} after step {step}; checkpoint {path}; run the same command to resume")
        self.step, self.path, self.interrupted = step, path, interrupted

    @property
    def exit_status(self) -> int:
        return EXIT_INTERRUPTED if self.interrupted else EXIT_PREEMPTED


def cli_main(work: Callable[[], object]) -> int:
    """The guard of the single-process command-line tools (the data tools, the plot): runs ``work()``; exit
    status 0, or ``work()``'s result where that is an int. A `UserError` becomes one line ``error: <message>``
    on stderr and exit status 2, without a traceback. (Commands with several ranks: `vitlarge.train.command.exit_status`.)
    """
    try:
        status = work()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_status
    return status if isinstance(status, int) else 0
