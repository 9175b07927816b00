"""docs/PERFORMANCE.md is what `python -m benchmarks.report` writes from the committed results (a hand edit, or a
result changed without the doc, is caught here rather than undone by the next `make bench`), and the start-up goal
judges vitlarge under timm's own launcher."""

from __future__ import annotations

import copy
import json

import pytest
import timm  # noqa: F401  (the report's dry-run quotes build models through timm: imported at collection, not in a call)

from benchmarks.report import performance as report
from tests.helpers import ROOT

NO_PLOTS = "_matplotlib is not installed: plots were not regenerated._\n\n"


def test_the_committed_doc_is_what_the_report_writes_from_the_committed_results(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_plt", lambda: None)  # the plots are images: the text is what is compared
    out = report.generate(results=ROOT / "benchmarks" / "results", out=tmp_path / "PERFORMANCE.md", img=tmp_path)
    written = out.read_text().replace(NO_PLOTS, "", 1)
    committed = (ROOT / "docs" / "PERFORMANCE.md").read_text()
    assert written == committed, "docs/PERFORMANCE.md differs from the report: run python -m benchmarks.report"


def startup() -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / "startup.json").read_text())


def goal(d: dict) -> tuple[str, str]:
    (row,) = report.startup_section(d)[1]
    return row[2], row[3]


def test_the_start_up_goal_is_judged_under_torchrun_with_colossalai_run_beside_it():
    measured, verdict = goal(startup())
    assert measured.startswith("under torchrun, as timm's: 0.84x wall, 1.02x rank 0's CPU")
    assert "under `colossalai run`: 1.19x wall (its launcher's 5.5 s), 1.10x CPU" in measured
    assert verdict == "**met** in wall time under the same launcher; CPU even; not under `colossalai run`"


@pytest.mark.parametrize(
    "scale, expect", [(1.5, "**not met** under the same launcher"), (0.5, "**met** under the same")]
)
def test_the_start_up_verdict_follows_the_figures(scale, expect):
    d = copy.deepcopy(startup())
    for table in ("summary", "cpu_summary"):
        d[table]["vitlarge (torchrun)"]["outside the loop"] *= scale
    for r in d["runs"]:
        if r["contender"] == "vitlarge (torchrun)":
            r["cpu_phases"]["outside the loop"] *= scale
    measured, verdict = goal(d)
    assert verdict.startswith(expect) and "CPU even" not in verdict
    assert f"{0.84 * scale:.2f}x wall"[:3] in measured


def test_without_a_torchrun_column_the_goal_is_colossalai_runs():
    d = startup()
    for table in ("summary", "cpu_summary"):
        del d[table]["vitlarge (torchrun)"]
    measured, verdict = goal(d)
    assert measured.startswith("1.19x wall, 1.10x rank 0's CPU") and verdict == "**not met**"


def test_a_result_without_the_launcher_phases_is_read_without_them():
    d = startup()
    for table in ("summary", "cpu_summary"):
        d[table]["vitlarge"] = {k: v for k, v in d[table]["vitlarge"].items() if not k.startswith("launch:")}
    lines, [(_, _, measured, _)] = report.startup_section(d)
    assert "under `colossalai run`: 1.19x wall, 1.10x CPU" in measured and "launcher's" not in measured
    assert not any("Colossal-AI's command takes" in line for line in lines)
