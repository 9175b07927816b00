"""`make test`'s pytest runs (scripts/test_suite.sh, tests/conftest.py): the serial files (the Slurm ones) in a pytest
process of their own, in the order given, while two pytest-xdist workers take the other files whole (their module
fixtures made once); the status is a failure of either run.

The real script in a new process over small files whose tests record the process that ran them."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import ROOT

RECORD = """
import os


def _record(request):
    with open(os.environ["WORKER_LOG"], "a") as f:
        f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'serial')} {request.node.nodeid}\\n")
    assert os.environ.get("FAIL_IN") != request.node.nodeid


""" + "\n".join(f"def test_{i}(request):\n    _record(request)\n\n" for i in range(6))

SERIAL = ("test_slurm.py", "test_slurm_multinode.py")


def suite(pytester, fail_in: str = "") -> tuple[int, list[list[str]]]:
    log = pytester.path / "workers.log"
    log.unlink(missing_ok=True)
    # Not this run's own xdist worker's variables (PYTEST_XDIST_WORKER names the worker running this test): the
    # script's serial pytest would inherit them, as `make test` started from a shell does not.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env = {**inherited, "WORKER_LOG": str(log), "FAIL_IN": fail_in}
    cmd = [
        "bash",
        str(ROOT / "scripts" / "test_suite.sh"),
        sys.executable,
        "2",
        "tests",
        *(f"tests/{f}" for f in SERIAL),
    ]
    r = subprocess.run(cmd, cwd=pytester.path, env=env, capture_output=True, text=True, timeout=300)
    return r.returncode, [line.split() for line in log.read_text().splitlines()]


def test_the_serial_files_run_in_their_own_process_in_order_and_the_rest_whole_files_on_two_workers(pytester):
    pytester.makeconftest(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401  (the suite's order)\n"
    )
    (pytester.path / "tests").mkdir()
    for name in ("test_a", "test_b", "test_c", *(f.removesuffix(".py") for f in SERIAL)):
        (pytester.path / "tests" / f"{name}.py").write_text(RECORD)
    status, lines = suite(pytester)
    assert status == 0 and len(lines) == 30, lines
    by_file: dict[str, set[str]] = {}
    for worker, nodeid in lines:
        by_file.setdefault(nodeid.split("::")[0].split("/")[-1], set()).add(worker)
    assert all(len(w) == 1 for w in by_file.values()), by_file  # a file runs whole in one process
    assert by_file["test_slurm.py"] == by_file["test_slurm_multinode.py"] == {"serial"}, by_file
    assert {w for f in ("test_a.py", "test_b.py", "test_c.py") for w in by_file[f]} == {"gw0", "gw1"}, by_file
    serial = [nodeid for worker, nodeid in lines if worker == "serial"]
    assert serial == [f"tests/{f}::test_{i}" for f in SERIAL for i in range(6)], serial  # in the order given

    status, _ = suite(pytester, fail_in="tests/test_slurm_multinode.py::test_3")
    assert status == 1  # the other run passed: the serial run's failure is the status
