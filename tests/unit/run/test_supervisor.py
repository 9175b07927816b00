"""``python -m vitlarge.run``'s quiet agent log and its line for a failed rendezvous of the agents, in process."""

from __future__ import annotations

import importlib
import logging
import sys

from tests.helpers import call_main
from vitlarge.distributed.launcher import free_port
from vitlarge.errors import EXIT_RENDEZVOUS
from vitlarge.run import supervisor

PREFIX = "torch.distributed.elastic"


def test_every_agent_logger_is_quiet_also_those_made_when_the_rendezvous_handler_is_built(monkeypatch):
    monkeypatch.delenv("LOGLEVEL", raising=False)
    manager = logging.root.manager.loggerDict
    before = {n: lg.level for n, lg in manager.items() if n.startswith(PREFIX) and isinstance(lg, logging.Logger)}
    try:
        supervisor.quiet_torchrun_log()
        # what torch imports when it builds the rendezvous handler, after the supervisor quieted its loggers
        for backend in ("c10d_rendezvous_backend", "static_tcp_rendezvous", "dynamic_rendezvous", "registry"):
            importlib.import_module(f"{PREFIX}.rendezvous.{backend}")
        loud = [n for n in list(manager) if n.startswith(PREFIX) and logging.getLogger(n).getEffectiveLevel() < 50]
        assert loud == []
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


def test_the_agents_rendezvous_timing_out_is_one_line_and_69():
    """Node 1 of 2 waits for node 0's agent, which never starts (a peer pod still Pending): one line and
    `EXIT_RENDEZVOUS`, which a controller restarts, where torchrun prints a traceback and exits 1. No worker starts;
    a timeout of 0 s keeps the test short (torch's own store fails at once)."""
    port = free_port()  # bound and released: nobody listens on it
    args = ["--nnodes=2", "--node_rank=1", "--master_addr=127.0.0.1", f"--master_port={port}", "--rdzv_conf=timeout=0"]
    r = call_main("vitlarge.run.supervisor", *args, "train.py")
    assert r.returncode == EXIT_RENDEZVOUS
    assert r.stderr.startswith(f"error: rendezvous of the agents at 127.0.0.1:{port} failed (node rank 1 of 2): ")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and ".;" not in r.stderr, r.stderr


def test_help_begins_with_what_the_command_is_under_the_name_it_was_started_by(monkeypatch):
    """Issue 55 item 10: the installed ``vitlarge-run`` and ``python -m vitlarge.run`` each say their own name, what
    the command is in whole sentences (not a fragment of the module docstring's markup) and how to start it."""
    monkeypatch.setattr(sys, "argv", ["/venv/bin/vitlarge-run", "--help"])
    text = supervisor.parser().format_help()
    usage, description = text.split("\n\n")[:2]
    assert usage.startswith("usage: vitlarge-run [-h] ")
    assert description.startswith(
        "torchrun that keeps the workers' exit statuses and says a failure in one line (vitlarge-run where\n"
    ) and description.endswith("130 Ctrl-C.")
    assert "``" not in text and "vitlarge-run --nproc_per_node 4 -m vitlarge --config vit_b16 " in text
    monkeypatch.setattr(sys, "argv", ["/checkout/vitlarge/run/__main__.py", "--help"])
    assert supervisor.parser().format_help().startswith("usage: python -m vitlarge.run [-h] ")
