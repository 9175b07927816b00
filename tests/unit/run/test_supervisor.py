"""``python -m vitlarge.run``'s quiet agent log, in process."""

from __future__ import annotations

import importlib
import logging

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
