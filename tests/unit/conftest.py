"""The unit tier's two rules, checked (tests/README.md, Layout): a unit test runs in the pytest process, and fast.

- A unit test that starts a process (``subprocess``, ``os.fork``/``exec``/``posix_spawn``/``system``, a
  multiprocessing or DALI worker) fails at its teardown, naming the command: "tests/unit holds in-process
  tests: <test> started <command>; move it to tests/e2e (tests/README.md)". Watched from the start of its
  setup to the end of its call (not its teardown: the session's last teardown also runs other tiers' session
  fixtures' finalizers, such as the Slurm test cluster's ``scancel``), through an audit hook (``sys.addaudithook``) and multiprocessing's one
  spawn path, which raises no audit event. Only the tools in `ALLOWED` may run.
- A unit test that reads the checkout's own ``data/`` or ``runs/`` (what ``make demo`` or a user leaves there:
  the demo's data, its run) fails at its teardown, naming the path: "tests/unit reads what the checkout holds:
  <test> read <path>; give it its own data and workdir (tmp_path: --data, --workdir, data.path=, workdir=)". A
  recipe's default ``data/digits`` or ``runs/<recipe>`` resolves there, so a test that leaves them unset passes
  or fails by what the checkout holds (``make demo`` then ``make test``, the README's two commands). Watched
  through the same audit hook: ``open``, ``os.listdir``, ``os.scandir`` and ``glob.glob`` on a path there. A
  check of existence alone (``os.stat``) raises no event: where the folder is absent nothing is read, and where
  ``make demo`` made it (CI runs it before the suite) the read that follows is seen.
- Each unit test runs in an empty folder of its own (`own_cwd`), so a recipe's relative defaults resolve to
  nothing rather than into the checkout: reads made in native code (safetensors, DALI's C++ readers) raise no
  audit event, so the check above is the message, and the cwd is the guard. A test that needs the checkout's files
  names them from ``ROOT`` (tests/helpers).
- Unit tests whose call took over `BUDGET_S` are listed at the end of the session, one line each. A report,
  not a failure: a loaded 2-core CI machine must not turn a correct test red.
"""

from __future__ import annotations

import multiprocessing.util
import os
import sys

import pytest

from scripts.structure_report import RUN_FOLDERS
from tests.helpers import ROOT

# Executables a unit test may start, by name, each a short tool with no in-process API that is not a Python
# interpreter. Mounts go through libc in the test's own process instead (tests/helpers/mounts.py).
ALLOWED = {
    "ruff": "the format and lint check of the tree (test_layout.py): a Rust binary, well under a second",
}
BUDGET_S = 2.0  # a unit test's call, on a 2-core machine; the longer ones are listed at the end
PROCESS_EVENTS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system")

_started: list[str] | None = None  # what the running unit test started; None between unit tests
_read: list[str] = []  # what the running unit test read of `CHECKOUT_STATE` (collected while `_started` is a list)
# What make demo and a user's runs leave in the checkout; a test reads its own copies under tmp_path.
CHECKOUT_STATE = tuple(os.path.join(str(ROOT), name) for name in RUN_FOLDERS)
READ_EVENTS = ("open", "os.listdir", "os.scandir", "glob.glob")
BUDGET = pytest.StashKey[float]()  # a session's budget where not `BUDGET_S` (the check's own test sets one)


def _command(event: str, args: tuple) -> str | None:
    """The command an audit event starts, or None for an `ALLOWED` tool. The events' arguments:
    subprocess.Popen (executable, args, cwd, env); os.exec and os.posix_spawn (path, argv, env);
    os.spawn (mode, path, argv, env); os.system (command,); os.fork and os.forkpty ()."""
    if event in ("os.fork", "os.forkpty"):
        return f"a forked process ({event})"
    if event == "os.system":
        return os.fsdecode(args[0])
    path, argv = (args[1], args[2]) if event == "os.spawn" else (args[0], args[1])
    argv = [argv] if isinstance(argv, (str, bytes, os.PathLike)) else [os.fsdecode(a) for a in argv or []]
    program = path if path is not None else argv[0]
    if os.path.basename(os.fsdecode(program)) in ALLOWED:
        return None
    return " ".join(os.fsdecode(a) for a in argv)[:200]


def _checkout_path(args: tuple) -> str | None:
    """The path a read event names, where it lies in `CHECKOUT_STATE` (relative paths resolve against the cwd)."""
    path = args[0] if args else None
    if path is None or isinstance(path, int):  # os.listdir() of the cwd, an fd: no path of ours
        return None
    path = os.path.abspath(os.fsdecode(path))
    return path if any(path == top or path.startswith(top + os.sep) for top in CHECKOUT_STATE) else None


def _audit(event: str, args: tuple) -> None:
    if _started is not None and event in READ_EVENTS:
        try:
            path = _checkout_path(args)
        except Exception:  # an audit hook that raised would fail the call it watches
            path = None
        if path is not None:
            _read.append(path)
    if _started is not None and event in PROCESS_EVENTS:
        try:
            command = _command(event, args)
        except Exception:  # an audit hook that raised would fail the call it watches
            command = event
        if command is not None:
            _started.append(command)


sys.addaudithook(_audit)  # cannot be removed: `_started` gates it to the unit tests' run

_spawnv_passfds = multiprocessing.util.spawnv_passfds


def _spawnv_passfds_seen(path, args, passfds):
    """multiprocessing's "spawn" and "forkserver" start their interpreter here, with no audit event."""
    if _started is not None:
        _started.append(" ".join(os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args)[:200])
    return _spawnv_passfds(path, args, passfds)


multiprocessing.util.spawnv_passfds = _spawnv_passfds_seen


def tier_message(nodeid: str, commands: list[str]) -> str:
    more = f" (and {len(commands) - 1} more)" if len(commands) > 1 else ""
    return (
        f"tests/unit holds in-process tests: {nodeid} started {commands[0]}{more}; "
        "move it to tests/e2e (tests/README.md)"
    )


def checkout_message(nodeid: str, paths: list[str]) -> str:
    more = f" (and {len(set(paths)) - 1} more)" if len(set(paths)) > 1 else ""
    return (
        f"tests/unit reads what the checkout holds: {nodeid} read {paths[0]}{more}; give it its own data and "
        "workdir (tmp_path: --data, --workdir, data.path=, workdir=)"
    )


@pytest.fixture(autouse=True)
def own_cwd(tmp_path_factory, monkeypatch):
    """The test's cwd: an empty folder of its own (not its ``tmp_path``, which a test may expect to hold only what it
    wrote there)."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(autouse=True)
def pil_bomb_guard(monkeypatch):
    """PIL's decompression-bomb limit back to what it was after each test: the converter sets that process-wide
    global to its ``--max-image-pixels`` (``imagefolder.prepare_bytes``), and a test's small limit must not turn
    a later test's plot into a "decompression bomb" (seen: 12,000 pixels set by one, a 931,700-pixel PNG refused
    in another run by the same worker)."""
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _started, _read
    (outer, outer_read), (_started, _read) = (_started, _read), ([], [])  # nested: a pytester session keeps its own
    try:
        yield
    finally:
        _started, _read = outer, outer_read


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Not watched: finalizers of wider-scoped fixtures run here, whatever tier requested them."""
    global _started
    watched, _started = _started, None
    try:
        yield
    finally:
        _started = watched


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _started and report.passed:
        report.outcome = "failed"
        report.longrepr = tier_message(item.nodeid, _started)
    elif call.when == "teardown" and _read and report.passed:
        report.outcome = "failed"
        report.longrepr = checkout_message(item.nodeid, _read)


class _Budget:
    """Lists the unit tests whose call took over the budget, where the reports arrive: the session itself, or
    pytest-xdist's controller (`make test` runs 2 workers; a worker's own summary is never printed)."""

    def __init__(self, config: pytest.Config, prefix: str):
        self.config, self.prefix, self.over = config, prefix, []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        budget = self.config.stash.get(BUDGET, BUDGET_S)
        if report.when == "call" and report.nodeid.startswith(self.prefix) and report.duration > budget:
            self.over.append((report.duration, report.nodeid))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.over:
            budget = self.config.stash.get(BUDGET, BUDGET_S)
            terminalreporter.section(f"unit tests over the {budget:g} s budget (tests/README.md: shrink or move)")
            for duration, nodeid in sorted(self.over, reverse=True):
                terminalreporter.write_line(f"{duration:6.2f}s {nodeid}")


def register_budget(config: pytest.Config, prefix: str = "tests/unit/") -> None:
    """The budget report, once per session and not in an xdist worker (the controller prints it): called by
    tests/conftest.py (which the controller loads too) and below (a session started inside tests/unit)."""
    if not hasattr(config, "workerinput") and not config.pluginmanager.has_plugin("unit-budget"):
        config.pluginmanager.register(_Budget(config, prefix), "unit-budget")


def pytest_configure(config):
    register_budget(config)
