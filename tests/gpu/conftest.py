"""The GPU tier (``make test-gpu``; on a bare CUDA machine ``scripts/gpu_tier.sh``): every GPU-only path, run where
CUDA is. Without CUDA each test here is skipped with its reason, so the CPU suite counts them as skipped,
never silently missing; a test that needs a package the machine lacks (DALI, Colossal-AI) is skipped naming it.

Each test records what it showed (``record_property("shows", ...)``); the session ends with one table of
test, result and what it showed, printed and, where ``VITLARGE_GPU_TABLE`` names a file, written there.

On another stack than the pinned one (a GPU image's torch 2.11), a deprecation warning is not a GPU
failure: here, in process and in the runs the tests start, warnings print instead of failing (the CPU
suite keeps them as errors, conftest.py at the root).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
CUDA = torch.cuda.is_available()
NO_CUDA = "no CUDA device here (torch.cuda.is_available() is False); this tier runs where one is: make test-gpu"


def needs(module: str, why: str) -> pytest.MarkDecorator:
    """Skips a test (with the reason) where ``module`` is not installed."""
    missing = importlib.util.find_spec(module.split(".")[0]) is None or _find(module) is None
    return pytest.mark.skipif(missing, reason=f"{module} is not installed here: {why}")


def _find(module: str):
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def _ours(item) -> bool:
    return HERE in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not _ours(item):
            continue
        if not CUDA:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA))
        item.add_marker(pytest.mark.filterwarnings("default::DeprecationWarning"))
        item.add_marker(pytest.mark.filterwarnings("default::FutureWarning"))


@pytest.fixture(autouse=True)
def _warnings_print_in_runs(request, monkeypatch):
    if _ours(request.node):
        monkeypatch.setenv("PYTHONWARNINGS", "default")


class GpuTable:
    """The session's table of test, result and what it showed, kept where the reports arrive: the session, or
    pytest-xdist's controller (`make test` runs 2 workers, whose own summaries are never printed)."""

    def __init__(self):
        self.rows: list[tuple[str, str, str]] = []
        self.shows: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        if "tests/gpu/" not in report.nodeid.replace("\\", "/"):
            return
        for key, value in report.user_properties:
            if key == "shows":
                self.shows[report.nodeid] = str(value)
        if (
            report.when == "call"
            or (report.when != "call" and report.failed)
            or (report.when == "setup" and report.skipped)
        ):
            outcome = report.outcome
            why = self.shows.get(report.nodeid, "")
            if report.skipped and isinstance(report.longrepr, tuple):
                why = report.longrepr[2].removeprefix("Skipped: ")
            elif report.failed:
                crash = getattr(report.longrepr, "reprcrash", None)
                failure = (crash.message.splitlines()[0] if crash else str(report.longrepr).splitlines()[-1])[:300]
                why = f"{why}; FAILED: {failure}" if why else failure
            self.rows.append((report.nodeid.split("::", 1)[1], outcome, why))

    def pytest_terminal_summary(self, terminalreporter):
        if not self.rows:
            return
        device = torch.cuda.get_device_name() if CUDA else "no CUDA device"
        lines = [
            f"GPU tier on {device}, torch {torch.__version__}:",
            "",
            "| test | result | what it showed |",
            "|---|---|---|",
            *(f"| `{name}` | {outcome} | {why.replace('|', '/')} |" for name, outcome, why in self.rows),
        ]
        terminalreporter.write_line("")
        for line in lines:
            terminalreporter.write_line(line)
        if os.environ.get("VITLARGE_GPU_TABLE"):
            Path(os.environ["VITLARGE_GPU_TABLE"]).write_text("\n".join(lines) + "\n")


def register_table(config: pytest.Config) -> None:
    """The table, once per session and not in an xdist worker: called by tests/conftest.py (which the controller
    loads too) and below (a session started inside tests/gpu, as scripts/gpu_tier.sh does)."""
    if not hasattr(config, "workerinput") and not config.pluginmanager.has_plugin("gpu-table"):
        config.pluginmanager.register(GpuTable(), "gpu-table")


def pytest_configure(config):
    register_table(config)
