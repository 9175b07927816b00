"""The whole suite's session: the order in which `make test` hands files to pytest-xdist's workers, and the unit budget
report.

`make test` (scripts/test_suite.sh) runs the Slurm files in a pytest process of their own, in file order (they share
the machine's one test cluster and change its shape between them), and the rest with ``pytest -n 2 --dist loadfile``:
each test file is one unit of work (its module fixtures, such as a reference run, are made once, by the worker that
runs the file). A plain ``pytest`` (no ``-n``) runs as before.
"""

from __future__ import annotations


def pytest_collection_modifyitems(config, items):
    """In an xdist worker (each collects the same list; the controller hands out whole files from it in its
    order): the end-to-end files first, the longer units of work, then the unit tier's small files, which fill the
    gaps at the end. A plain session keeps pytest's order."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: 0 if item.nodeid.startswith("tests/e2e/") else 1)


def pytest_configure(config):
    from tests.gpu.conftest import register_table
    from tests.unit.conftest import register_budget

    register_budget(config)
    register_table(config)
