"""The whole suite's session: how `make test` spreads it over pytest-xdist's workers, and the unit budget report.

`make test` runs ``pytest -n 2 --dist loadgroup``: each test file is one unit of work (its module fixtures,
such as a reference run, are made once, by the worker that runs the file), and the Slurm files are one unit
together (they share the machine's one test cluster and change its shape between them), kept in file order.
A plain ``pytest`` (no ``-n``) runs as before; the groups are then only markers.
"""

from __future__ import annotations

import os

import pytest

SERIAL = {"test_slurm.py": "slurm", "test_slurm_multinode.py": "slurm", "test_slurm_scripts.py": "slurm"}
"""Files that must run in one worker, one after another: one group name for each set."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the markers (it appends the group to node ids)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            path = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(SERIAL.get(os.path.basename(path), path)))


def pytest_configure(config):
    from tests.unit.conftest import register_budget

    register_budget(config)
