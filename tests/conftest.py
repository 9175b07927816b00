"""The whole suite's session: how `make test` spreads it over pytest-xdist's workers, and the unit budget report.

`make test` runs ``pytest -n 2``: each test file is one unit of work (its module fixtures, such as a reference
run, are made once, by the worker that runs the file), and the Slurm files are one unit together (they share
the machine's one test cluster and change its shape between them), kept in file order. A plain ``pytest``
(no ``-n``) runs as before.
"""

from __future__ import annotations

import os

SERIAL = {"test_slurm.py": "slurm", "test_slurm_multinode.py": "slurm", "test_slurm_scripts.py": "slurm"}
"""Files that must run in one worker, one after another: one group name for each set."""


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's file scheduling, with the `SERIAL` files as one unit. (Its ``--dist loadgroup`` would
    read ``xdist_group`` markers, but renames node ids to do it, which pytest 9 ignores: it splits a file.)"""
    from xdist.scheduler import LoadFileScheduling

    class ByFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SERIAL.get(os.path.basename(path), path)

    return ByFile(config, log)


def pytest_collection_modifyitems(config, items):
    """In an xdist worker (each collects the same list; the controller hands out whole files from it in its
    order): the Slurm files first, the longest unit of work, then the other end-to-end files, then the unit
    tier's small files, which fill the gaps at the end. A plain session keeps pytest's order."""
    if hasattr(config, "workerinput"):
        items.sort(key=_start_order)


def _start_order(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    if os.path.basename(path) in SERIAL:
        return 0
    return 1 if path.startswith("tests/e2e/") else 2


def pytest_configure(config):
    from tests.gpu.conftest import register_table
    from tests.unit.conftest import register_budget

    register_budget(config)
    register_table(config)
