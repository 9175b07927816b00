"""The unit tier's check (tests/unit/conftest.py) is live: a unit test that starts a process fails in one line
naming it, one that does not passes, `ALLOWED` tools pass; the tests over the time budget are listed.

A session inside this test (pytester, in this process) with the same hooks. Its tests raise the audit events
a process start raises (``sys.audit``) instead of starting one: what the hook sees is the same event, and
this test starts nothing itself.
"""

from __future__ import annotations

import multiprocessing.util
import os

from tests.unit import conftest as tier

INNER_TESTS = """
import sys


def test_starts_a_python():
    sys.audit("subprocess.Popen", sys.executable, [sys.executable, "-c", "import torch"], None, None)


def test_forks():
    sys.audit("os.fork")


def test_shell():
    sys.audit("os.system", b"touch /tmp/x")


def test_in_process():
    assert sum(range(4)) == 6


def test_runs_ruff():
    sys.audit("subprocess.Popen", None, ["/venv/bin/ruff", "check", "."], None, None)
"""


def inner_session(pytester, *args, conftest: str = ""):
    pytester.makeconftest("from tests.unit.conftest import *  # noqa: F403  (the unit tier's hooks)\n" + conftest)
    pytester.makepyfile(test_inner=INNER_TESTS)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)


def test_a_unit_test_that_starts_a_process_fails_in_one_line_naming_it(pytester):
    result = inner_session(pytester)
    result.assert_outcomes(passed=5, errors=3)  # each teardown of the three that start a process
    result.stdout.fnmatch_lines_random(
        [
            "tests/unit holds in-process tests: test_inner.py::test_starts_a_python started * -c import torch; "
            "move it to tests/e2e (tests/README.md)",
            "tests/unit holds in-process tests: test_inner.py::test_forks started a forked process (os.fork); "
            "move it to tests/e2e (tests/README.md)",
            "tests/unit holds in-process tests: test_inner.py::test_shell started touch /tmp/x; "
            "move it to tests/e2e (tests/README.md)",
        ]
    )
    errored = {line.split()[1] for line in result.outlines if line.startswith("ERROR ")}
    assert errored == {f"test_inner.py::test_{n}" for n in ("starts_a_python", "forks", "shell")}


def test_multiprocessings_spawn_path_is_watched():
    """multiprocessing's spawn and forkserver start their interpreter through this function: no audit event."""
    assert multiprocessing.util.spawnv_passfds is tier._spawnv_passfds_seen


def test_the_tests_over_the_budget_are_listed_and_pass(pytester):
    every_test_is_over = (
        "def pytest_configure(config):\n    config.stash[BUDGET] = -1.0\n    register_budget(config, prefix='')\n"
    )
    result = inner_session(pytester, "-k", "in_process or ruff", conftest=every_test_is_over)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*unit tests over the -1 s budget (tests/README.md: shrink or move)*",
            "*s test_inner.py::test_*",
            "*s test_inner.py::test_*",
        ]
    )


def test_a_session_fixtures_finalizer_is_not_charged_to_the_last_unit_test(pytester):
    """Found in a full run: the e2e Slurm cluster's session fixture ran ``scancel`` at the session's last teardown,
    which was a unit test's. Teardowns are not watched; the test's own setup and call are."""
    finalizer_starts_a_process = """
import sys

import pytest


@pytest.fixture(scope="session")
def cluster():
    yield
    sys.audit("subprocess.Popen", "scancel", ["scancel", "--name=x"], None, None)


@pytest.fixture(autouse=True)
def uses_cluster(cluster):
    yield
"""
    result = inner_session(pytester, "-k", "in_process", conftest=finalizer_starts_a_process)
    result.assert_outcomes(passed=1)


CHECKOUT_READS = f"""
import os
import sys

ROOT = {str(tier.ROOT)!r}


def test_opens_the_demos_data():
    sys.audit("open", os.path.join(ROOT, "data", "digits", "dataset.json"), "r", 0)


def test_lists_a_run_relative_to_the_checkout():
    os.chdir(ROOT)
    try:
        sys.audit("os.scandir", "runs/demo_digits/checkpoints")
    finally:
        os.chdir(os.environ["INNER_CWD"])


def test_reads_its_own_data_folder():
    sys.audit("open", "data/digits/dataset.json", "r", 0)  # the cwd is the session's folder, not the checkout
    sys.audit("open", os.path.join(ROOT, "recipes", "demo_digits.py"), "r", 0)
    sys.audit("open", os.path.join(ROOT, "database.json"), "r", 0)  # a sibling whose name starts "data"
"""


def test_a_unit_test_that_reads_the_checkouts_data_or_runs_fails_in_one_line_naming_it(pytester, monkeypatch):
    """``make demo`` leaves data/digits and runs/demo_digits in the checkout; a unit test that reads them passes or
    fails by what the checkout holds, so it fails at its teardown whether they are there or not."""
    monkeypatch.setenv("INNER_CWD", str(pytester.path))
    pytester.makeconftest("from tests.unit.conftest import *  # noqa: F403  (the unit tier's hooks)\n")
    pytester.makepyfile(test_inner=CHECKOUT_READS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=2)
    root = str(tier.ROOT)
    result.stdout.fnmatch_lines_random(
        [
            f"tests/unit reads what the checkout holds: test_inner.py::test_opens_the_demos_data read {root}/data/"
            "digits/dataset.json; give it its own data and workdir (tmp_path: --data, --workdir, data.path=, workdir=)",
            f"tests/unit reads what the checkout holds: test_inner.py::test_lists_a_run_relative_to_the_checkout read "
            f"{root}/runs/demo_digits/checkpoints; give it its own data and workdir *",
        ]
    )


def test_each_unit_test_runs_in_an_empty_folder_of_its_own_not_the_checkout():
    """A recipe's relative defaults (``data/digits``, ``runs/<recipe>``) resolve against the cwd; in the checkout they
    found what ``make demo`` left there, and reads made in native code (safetensors, DALI's readers) raise no audit
    event for the check above to see. Each unit test's cwd is a folder of its own, so they resolve to nothing."""
    cwd = os.getcwd()
    assert os.path.commonpath([cwd, str(tier.ROOT)]) != str(tier.ROOT), cwd
    assert os.listdir(cwd) == []
    assert not os.path.abspath("data/digits").startswith(str(tier.ROOT) + os.sep)
