"""The compile matrix's parsing and table (benchmarks/bench_compile_matrix.py, benchmarks/report/compile_matrix.py),
in process: the runs themselves are the benchmark's, not the suite's."""

from __future__ import annotations

import re

from benchmarks import bench_compile_matrix as matrix
from benchmarks.report import compile_matrix as report

# What vitlarge.train.compile_stats.CompileStats.line() prints, behind a logger's prefix, around other lines.
OUTPUT = """\
compile on: set by the recipe
[rank0]: compile: 3 graphs, 2 graph breaks, 0 recompiles (first break: Attempted to call function marked as skipped)
train step  1/20 | epoch 0.02 | loss 2.3137
compile: 6 graphs, 4 graph breaks, 4 recompiles (first break: Attempted to call function marked as skipped; first recompile: 0/0: GLOBAL_STATE changed: grad_mode)
compile: 2 graphs, 0 graph breaks, 1 recompiles (first recompile: 0/0: GLOBAL_STATE changed: grad_mode)
"""


def test_compile_lines_are_parsed_in_order_with_their_first_reasons():
    first, end, ddp = matrix.parse_compile_lines(OUTPUT)
    assert first == {
        "graphs": 3,
        "graph_breaks": 2,
        "recompiles": 0,
        "first_break": "Attempted to call function marked as skipped",
        "first_recompile": None,
    }
    assert (end["graphs"], end["graph_breaks"], end["recompiles"]) == (6, 4, 4)
    assert end["first_recompile"] == "0/0: GLOBAL_STATE changed: grad_mode"
    assert ddp["first_break"] is None and ddp["recompiles"] == 1
    assert matrix.parse_compile_lines("compile on: set by the recipe\n") == []


def test_the_matrix_is_every_combination_and_each_turns_its_switches_on():
    combos = matrix.combos()
    # The whole model with checkpointing off and full (12), each block with off, full and selective (18).
    assert len(combos) == len({c.name for c in combos}) == 12 + 18
    fsdp = matrix.Combo("fsdp", "full", "fp16")
    assert fsdp.name == "fsdp/ckpt/fp16"  # the whole model's rows keep their names
    assert fsdp.overrides() == [
        "train.plugin=fsdp",
        "train.activation_checkpointing=full",
        "train.precision=fp16",
        "train.deterministic=true",
        "train.compile_scope=model",
    ]
    blocks = matrix.Combo("ddp", "selective", "bf16", "blocks")
    assert (
        blocks.name == "ddp/sel-ckpt/bf16/blocks"
        and blocks.overrides()[1] == "train.activation_checkpointing=selective"
    )


def test_a_partial_run_keeps_the_other_rows_of_the_result(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("VITLARGE_BENCH_RESULTS", str(tmp_path))
    before = {"finished_at": "2026-11-25 10:00:00", "rows": [{"name": "ddp/no-ckpt/bf16", "steps": 200}]}
    (tmp_path / "compile_matrix.json").write_text(json.dumps(before))
    assert matrix.previous_rows() == {
        "ddp/no-ckpt/bf16": {"name": "ddp/no-ckpt/bf16", "steps": 200, "measured_at": "2026-11-25"}
    }


def test_loss_agreement_and_step_time_skip_nothing_they_should_not():
    agreement = matrix.loss_agreement({1: 2.0, 2: 1.5, 3: 1.0}, {1: 2.0, 2: 1.25, 4: 9.0})
    assert agreement == {"steps": 2, "max_abs": 0.25, "mean_abs": 0.125}
    records = {s: {"step_time": 100.0 if s <= matrix.WARM else float(s)} for s in range(1, matrix.WARM + 4)}
    assert matrix.median_step_s(records) == matrix.WARM + 2  # the compile step and the warm-up are left out


ROW = {
    "name": "fsdp/ckpt/bf16",
    "steps": 300,
    "trains": True,
    "resume_bitwise": True,
    "killed_after_step": 153,
    "resumed_at": 150,
    "loss_agreement": {"steps": 300, "max_abs": 0.0123, "mean_abs": 0.001},
    "tolerance": 0.05,
    "loss_within_tolerance": True,
    "compile_after_step_1": {"graphs": 3, "graph_breaks": 2, "recompiles": 0, "first_break": "skipped"},
    "compile_at_end": {
        "graphs": 6,
        "graph_breaks": 4,
        "recompiles": 4,
        "first_break": "skipped",
        "first_recompile": "a|b",
    },
    "compiled_vs_eager_time": 1.234,
    "eager_step_s": 0.0912,
}


MATRIX = {
    "recipe": "recipes/demo_digits.py",
    "model_kwargs": "{}",
    "batch": "b",
    "processes": 2,
    "data": "synthetic",
    "warm_steps_excluded": 5,
    "wall_s": 2400,
    "machine": {"cpu": "AMD EPYC", "os_cpus": 2, "torch": "2.10.0"},
    "rows": [ROW, {"name": "ddp/no-ckpt/fp16", "steps": 300, "error": "RuntimeError: exit 1: log\nTraceback"}],
}


def test_the_table_has_one_row_per_combination_and_says_which_failed():
    lines = report.table(MATRIX)
    header = next(i for i, line in enumerate(lines) if line.startswith("|---"))
    rows = lines[header + 1 : -1]
    cells = [len(re.split(r"(?<!\\)\|", line)) for line in (lines[header], *rows)]  # an escaped \| is text
    assert len(rows) == 2 and len(set(cells)) == 1, cells
    assert rows[0] == (
        "| fsdp/ckpt/bf16 | 300 | yes | yes (killed after 153, resumed at 150) | 1.2e-02 (yes, <= 0.05) | 3 / 2 / 0 | "
        "6 / 4 / 4 | break: skipped; recompile: a\\|b | 1.23x (91 ms eager) |"
    )
    assert rows[1].startswith("| ddp/no-ckpt/fp16 | 300 | **failed**: RuntimeError: exit 1: log |")


def test_performance_md_renders_the_table_under_the_compile_section_or_nothing_without_a_result():
    from benchmarks.report import performance

    # Not in benchmarks.run's suite: a report made from the suite's results has no such section (no "not run",
    # which there means a suite benchmark that failed: tests/e2e/test_benchmarks.py).
    assert performance.compile_matrix_section(None) == []
    assert performance.timm_parity_section({"timm_parity": None, "timm_parity_ls01": None}) == ([], [])
    section = performance.compile_matrix_section(MATRIX)
    assert section[0].startswith("### ") and report.row(ROW) in section
