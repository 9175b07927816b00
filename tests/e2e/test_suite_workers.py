"""`make test`'s two pytest-xdist workers (tests/conftest.py): a test file runs whole on one worker (its module
fixtures made once), and the Slurm files run on one worker, in file order (they share the one test cluster).

A real ``pytest -n 2`` in a new process over small files whose tests record the worker that ran them."""

from __future__ import annotations

import os

from tests.helpers import ROOT

RECORD = """
import os


def _record(request):
    with open(os.environ["WORKER_LOG"], "a") as f:
        f.write(f"{os.environ['PYTEST_XDIST_WORKER']} {request.node.nodeid}\\n")


""" + "\n".join(f"def test_{i}(request):\n    _record(request)\n\n" for i in range(6))


def test_a_file_runs_on_one_worker_and_the_slurm_files_together_in_order(pytester):
    pytester.makeconftest(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.conftest import SERIAL, pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401  (the suite's scheduling)\n"
    )
    pytester.makepyfile(
        **{name: RECORD for name in ("test_a", "test_b", "test_c", "test_slurm", "test_slurm_multinode")}
    )
    log = pytester.path / "workers.log"
    os.environ["WORKER_LOG"] = str(log)  # pytester restores os.environ after the test
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=30)
    lines = [line.split() for line in log.read_text().splitlines()]
    by_file: dict[str, set[str]] = {}
    for worker, nodeid in lines:
        by_file.setdefault(nodeid.split("::")[0], set()).add(worker)
    assert len(by_file) == 5 and all(len(w) == 1 for w in by_file.values()), by_file
    assert by_file["test_slurm.py"] == by_file["test_slurm_multinode.py"], by_file
    assert len({w for ws in by_file.values() for w in ws}) == 2, by_file  # both workers had work
    firsts = {}
    for worker, nodeid in lines:
        firsts.setdefault(worker, nodeid)
    assert "test_slurm.py::test_0" in firsts.values(), firsts  # the longest unit starts first
    slurm_files = [nodeid.split("::")[0] for _, nodeid in lines if nodeid.startswith("test_slurm")]
    assert slurm_files == sorted(slurm_files), slurm_files  # test_slurm.py's tests, then test_slurm_multinode.py's
