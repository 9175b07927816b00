"""benchmarks/harness/results.py: a smoke run's (``--tiny``) numbers never land in the checkout's results, which
docs/PERFORMANCE.md is generated from (`python -m benchmarks.report`)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks.harness import results


@pytest.fixture
def no_results_env(monkeypatch):
    """``VITLARGE_BENCH_RESULTS`` unset, as in a user's shell; whatever folder a write sets it to is removed."""
    monkeypatch.setenv("VITLARGE_BENCH_RESULTS", "unset-below")
    monkeypatch.delenv("VITLARGE_BENCH_RESULTS")
    monkeypatch.delenv(results.TINY_ENV, raising=False)
    yield
    import os

    made = os.environ.get("VITLARGE_BENCH_RESULTS")
    if made and Path(made).resolve() != results.RESULTS_DIR:
        shutil.rmtree(made, ignore_errors=True)


NAME = "unit_test_tiny_result"


def test_a_tiny_result_is_written_outside_the_checkouts_results(no_results_env):
    out = results.write_result(NAME, {"tiny": True, "x": 1})
    try:
        assert not (results.RESULTS_DIR / f"{NAME}.json").exists()  # compile.json was overwritten so (0f5a763)
        assert results.RESULTS_DIR not in out.resolve().parents and json.loads(out.read_text())["x"] == 1
    finally:
        (results.RESULTS_DIR / f"{NAME}.json").unlink(missing_ok=True)
        out.unlink(missing_ok=True)


def test_a_benchmarks_own_tiny_flag_writes_outside_the_checkouts_results(no_results_env, monkeypatch, capsys):
    written = []

    def run(quick: bool, tiny: bool) -> dict:  # a benchmark whose result does not record "tiny" (data, convert)
        written.append(results.write_result(NAME, {"quick": quick}))
        return {}

    monkeypatch.setattr(sys, "argv", ["bench_unit", "--tiny"])
    try:
        results.cli(run, "a benchmark")
        assert not (results.RESULTS_DIR / f"{NAME}.json").exists()
        assert results.RESULTS_DIR not in written[0].resolve().parents
        assert str(written[0].parent) in capsys.readouterr().err  # says where the smoke run's numbers went
    finally:
        (results.RESULTS_DIR / f"{NAME}.json").unlink(missing_ok=True)


def test_a_full_size_result_after_a_tiny_one_in_one_process_goes_to_the_results(no_results_env, monkeypatch, tmp_path):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr(results, "_process_tiny_dir", [tmp_path / "tiny"])
    tiny = results.write_result(NAME, {"tiny": True})
    full = results.write_result(NAME, {"tiny": False})
    assert tiny.parent == tmp_path / "tiny" and full.parent == tmp_path / "results"  # the redirect stuck (review 63)
