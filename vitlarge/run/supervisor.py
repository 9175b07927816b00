"""``python -m vitlarge.run``: torchrun that keeps the workers' exit statuses and says a failure in one line.

    python -m vitlarge.run --nproc_per_node 4 train.py --config recipes/vit_b16.py --data /data/imagenet-tfrecord
    python -m vitlarge.run --nnodes 2 --node_rank 0 --master_addr node1 --nproc_per_node 8 train.py ...

It takes torchrun's options, parsed by ``torch.distributed.run`` itself, and runs torchrun's agent in this process
(``launch_agent``), so rendezvous, restarts and the elastic options behave exactly as torchrun's. Only the ending
differs:

* a worker failed: one line, ``vitlarge.run: rank R exited with status S: <the worker's own line>``, and this
  process exits with S (2 bad input, 3 NaN guard, 69 a failed rendezvous, 75 checkpointed on SIGTERM/SIGUSR1,
  130 on Ctrl-C; a worker ended by signal N counts as 128 + N), where torchrun prints a ``ChildFailedError``
  traceback and exits 1;
* the agents' own rendezvous failed (another node's agent did not arrive within the rendezvous timeout, or the
  master's address could not be reached): one line, ``error: rendezvous of the agents at HOST:PORT failed ...``,
  and 69, where torchrun prints a traceback and exits 1;
* Ctrl-C or SIGTERM reaching this process: torchrun's agent passes it to the workers, which checkpoint and say so;
  this process then exits with their status (130, 75), without a traceback. A second Ctrl-C ends the workers
  at once (SIGKILL), as it ends ``python train.py``;
* a busy ``--master_port``: one line naming it and a free one, exit 2.

torchrun's own log (``W... Sending process ... closing signal``, ``E... failed (exitcode: 2)``) is left out: its
content is in the summary line. ``LOGLEVEL=INFO`` (torchrun's variable) shows it again.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass

import psutil
from torch.distributed import DistError
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

# The rendezvous backends, which torch imports only when it builds the handler: loaded here, so that their loggers
# exist when `quiet_torchrun_log` sets every agent logger's level.
from torch.distributed.elastic.rendezvous import (  # noqa: F401
    c10d_rendezvous_backend,
    dynamic_rendezvous,
    static_tcp_rendezvous,
)
from torch.distributed.launcher.api import launch_agent

from vitlarge.errors import EXIT_BAD_INPUT, EXIT_RENDEZVOUS

PROG = "python -m vitlarge.run"
DESCRIPTION = """torchrun that keeps the workers' exit statuses and says a failure in one line (vitlarge-run where
vitlarge is installed). It takes torchrun's options, then the training script (or -m vitlarge) and its arguments,
and ends with the first failed worker's own status: 2 bad input, 3 NaN guard, 69 a failed rendezvous,
75 checkpointed on SIGTERM/SIGUSR1, 130 Ctrl-C."""
EXAMPLES = """examples:
  python -m vitlarge.run --nproc_per_node 4 train.py --config recipes/vit_b16.py --data /data/imagenet-tfrecord
  vitlarge-run --nproc_per_node 4 -m vitlarge --config vit_b16 --data /data/imagenet-tfrecord   (installed)
  vitlarge-run --nnodes 2 --node_rank 0 --master_addr node1 --nproc_per_node 8 -m vitlarge --config vit_b16 ..."""


@dataclass(frozen=True)
class WorkerEnd:
    """How one worker ended: its global rank, its exit status as a shell reports it (128 + N for signal N), and
    its own line (from its error file), or ''."""

    rank: int
    status: int
    line: str

    def summary(self) -> str:
        said = f": {self.line}" if self.line else "; its output above says why"
        return f"vitlarge.run: rank {self.rank} exited with status {self.status}{said}"


def shell_status(exitcode: int) -> int:
    """A process's status as a shell reports it: a death by signal N (Popen's -N) is 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode


def first_line(message) -> str:
    """The worker's own line from torchrun's error-file message (a dict written by the worker, or the string
    torchrun makes up when there is none: those say nothing the status does not)."""
    if isinstance(message, dict):
        message = message.get("message") or ""
    elif not isinstance(message, str) or message.startswith(("To enable traceback", "Signal ")):
        return ""
    lines = [x for x in str(message).splitlines() if x.strip()]
    return lines[0].strip() if lines else ""


def first_failure(failures: dict) -> WorkerEnd:
    """The failure the run ended on, from ``ChildFailedError.failures`` ({global rank: ProcessFailure}): the
    earliest (torchrun's timestamps, then the rank) of the workers that exited on their own (status > 0); only
    when every one was ended by a signal, the earliest of those. The agent ends the other workers with SIGTERM
    once one has failed, and those deaths can carry an earlier timestamp (from their error file) than the
    failure that caused them."""
    own = {r: f for r, f in failures.items() if f.exitcode > 0} or failures
    rank = min(own, key=lambda r: (own[r].timestamp, r))
    failure = own[rank]
    return WorkerEnd(rank, shell_status(failure.exitcode), first_line(failure.message))


def ends_in_error_files(log_dir: str, since: float) -> list[WorkerEnd]:
    """The ends the workers recorded in their error files (``TORCHELASTIC_ERROR_FILE``, under torchrun's log
    directory) since ``since``, earliest first: what is left to read after the agent itself was signalled, when
    torchrun gives no ``ChildFailedError``. Only files that carry ``exit_status`` (`vitlarge.distributed.process.
    tell_launcher` writes it) count; the rank is the global one the worker wrote."""
    found = []
    for path in glob.glob(os.path.join(log_dir, "*", "attempt_*", "*", "error.json")):
        try:
            if os.path.getmtime(path) < since or os.path.getsize(path) > 1 << 20:
                continue
            with open(path) as f:
                doc = json.load(f)
            status, rank = int(doc["exit_status"]), int(doc.get("rank", -1))
            stamp = int(doc["message"]["extraInfo"]["timestamp"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            continue
        found.append((stamp, rank, WorkerEnd(rank, status, first_line(doc["message"]))))
    return [end for _, _, end in sorted(found, key=lambda x: x[:2])]


def busy_port(error: BaseException | None) -> bool:
    """Whether ``error`` (or what caused it) is the rendezvous store's failure to listen on a port in use."""
    while error is not None:
        if "EADDRINUSE" in str(error) or "address already in use" in str(error).lower():
            return True
        error = error.__cause__ or error.__context__
    return False


def free_port_now() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # a gone reader must not change the status
        pass


class CtrlC:
    """SIGINT for this process, in place of torchrun's handler: the first raises torchrun's ``SignalException``
    (the agent then passes SIGINT to the workers and waits for them, as under torchrun); a later one ends the
    workers at once, where torchrun's agent would wait for them up to 30 s more, twice."""

    def __init__(self):
        self.count = 0

    def __call__(self, signum, frame):
        self.count += 1
        if self.count == 1:
            raise SignalException(f"Process {os.getpid()} got signal: {signal.SIGINT!r}", sigval=signal.SIGINT)

        for child in psutil.Process().children():
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


def quiet_torchrun_log() -> None:
    """torchrun's agent log at CRITICAL (unless ``LOGLEVEL`` is set): its failure lines are the summary's. Each
    of its loggers gets the level: torch's ``get_logger`` sets WARNING on each one, so the parent's is not
    enough. Every agent module, the rendezvous backends included, is imported with this module."""
    if os.environ.get("LOGLEVEL"):
        return

    prefix = "torch.distributed.elastic"
    for name in [prefix, *logging.root.manager.loggerDict]:
        if name == prefix or name.startswith(prefix + "."):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def parser() -> argparse.ArgumentParser:
    """torchrun's own parser (its options, parsed as torchrun parses them), with this command's name (as it was
    started: ``vitlarge-run`` or `PROG`), `DESCRIPTION` and `EXAMPLES`."""
    p = torchrun.get_args_parser()
    installed = os.path.basename(sys.argv[0]) == "vitlarge-run"  # the console script (pyproject.toml)
    p.prog, p.description, p.epilog = "vitlarge-run" if installed else PROG, DESCRIPTION, EXAMPLES
    p.formatter_class = argparse.RawDescriptionHelpFormatter  # the examples' lines as written
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.standalone:  # as torch.distributed.run.run does
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    quiet_torchrun_log()
    config, entrypoint, entry_args = torchrun.config_from_args(args)
    logs = config.logs_specs
    assert logs is not None  # LaunchConfig.__post_init__ makes DefaultLogsSpecs() in place of None
    handled = [s.strip() for s in config.signals_to_handle.split(",") if s.strip()]
    if "SIGINT" in handled:  # ours (CtrlC): torchrun's raises again on a second Ctrl-C, and waits again
        config.signals_to_handle = ",".join(s for s in handled if s != "SIGINT")
        signal.signal(signal.SIGINT, CtrlC())
    started = time.time() - 1  # error files' timestamps are whole seconds
    try:
        launch_agent(config, entrypoint, list(entry_args))
        return 0
    except ChildFailedError as e:
        end = first_failure(e.failures)
        say(end.summary())
        return end.status
    except SignalException as e:
        # The workers had the signal and have ended (they said why); their status is what they recorded.
        ends = ends_in_error_files(logs.root_log_dir, started)
        return ends[0].status if ends else 128 + int(e.sigval)
    except DistError as e:
        if busy_port(e):
            return port_in_use(args)
        first = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
        say(
            f"error: rendezvous of the agents at {torchrun.get_rdzv_endpoint(args)} failed (node rank "
            f"{args.node_rank} of {args.nnodes}): {first}; check that every node started and that the address "
            "is reachable"
        )
        return EXIT_RENDEZVOUS
    except Exception as e:
        if not busy_port(e):
            raise
        return port_in_use(args)


def port_in_use(args) -> int:
    """One line naming the rendezvous port already in use on this machine, and a free one: `EXIT_BAD_INPUT`."""
    if args.rdzv_backend == "static":
        where, fix = f"--master_port {args.master_port}", f"--master_port {free_port_now()}"
    else:
        where, fix = f"--rdzv-endpoint {args.rdzv_endpoint}", "another port in --rdzv-endpoint"
    say(f"error: {where} is in use on this machine (another run?): give this run another port, e.g. {fix}")
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
