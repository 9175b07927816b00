"""scripts/structure_report.py: the structure figures the closing notes compare (annotations, long functions,
the few call sites of resolve_phases and resolve_settings, the functions over the parameter budget), read from a
planted tree; the lines table, and that docs/DEVELOPING.md holds the checkout's."""

from pathlib import Path

import pytest

from scripts.structure_report import (
    DEVELOPING,
    lines_table,
    main,
    many_parameters,
    project_files,
    report,
    table_in,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_report_counts_annotations_returns_calls_and_long_functions(tmp_path):
    (tmp_path / "vitlarge").mkdir()
    (tmp_path / "hooks").mkdir()
    (tmp_path / "vitlarge" / "a.py").write_text(
        "def typed(x: int, *, y: str) -> int:\n    return resolve_phases(x)\n\n\n"
        "def untyped(self, x, y=object):\n    import os\n\n    return os.sep\n\n\n"
        "def none(z: object):\n    cfg.resolve_settings(z)\n    return None\n"
    )
    (tmp_path / "hooks" / "b.py").write_text("class H:\n    def f(self) -> None:\n        pass\n")
    lines = report(tmp_path, top=2)
    assert lines[0] == (
        "2 files, 4 functions; parameters annotated 3/5 (60.0%); value-returning functions without a return type 1; "
        "`object` annotations 1; imports inside functions 1"
    )
    assert lines[1:3] == ["calls of resolve_phases: 1", "calls of resolve_settings: 1"]
    assert lines[4].endswith("vitlarge/a.py:5 untyped") and lines[4].split()[:2] == ["4", "2"]
    assert lines[5].split()[:2] == ["3", "1"]
    assert lines[6:] == ["functions of the checkout with more than 8 parameters: 0 (at most 3, none over 12)"]


def test_parameters_are_counted_in_every_folder_but_self_and_cls_with_args_and_kwargs_one_each(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / ".venv").mkdir()
    nine = ", ".join(f"p{i}" for i in range(9))
    (tmp_path / "scripts" / "a.py").write_text(
        f"def nine({nine}):\n    pass\n\n\nclass C:\n    def eight(self, {nine[:-4]}):\n        pass\n\n\n"
        "def starred(a, b, c, d, e, f, g, *args, **kwargs):\n    pass\n"
    )
    (tmp_path / "top.py").write_text(f"async def nine_too(*, {nine}):\n    pass\n")
    (tmp_path / ".venv" / "lib.py").write_text(f"def hidden({nine}):\n    pass\n")  # not the checkout's
    assert many_parameters(tmp_path) == [
        (9, "scripts/a.py:1 nine"),
        (9, "scripts/a.py:10 starred"),
        (9, "top.py:1 nine_too"),
    ]


def test_the_lines_table_counts_each_folder_with_its_subfolders_and_names_a_folder_it_lacks(tmp_path):
    (tmp_path / "vitlarge" / "plan").mkdir(parents=True)
    (tmp_path / "vitlarge" / "a.py").write_text("x = 1\n" * 30)
    (tmp_path / "vitlarge" / "plan" / "b.py").write_text("y = 2\n" * 160)
    (tmp_path / "train.py").write_text("z = 3\n" * 20)
    table = lines_table(tmp_path)
    assert table[2] == "| `train.py` | 1 | < 50 | the command: parse, build the run, fit |"
    assert table[3].startswith("| `vitlarge/` | 2 | 200 |") and table[4].startswith("| `vitlarge/plan/` | 1 | 200 |")
    assert table[-1] == "| all | 3 | 200 | every Python file of the checkout |" and len(table) == 6
    (tmp_path / "vitlarge" / "new").mkdir()
    (tmp_path / "vitlarge" / "new" / "c.py").write_text("")
    with pytest.raises(ValueError, match="vitlarge/new/ holds Python files but has no line"):
        lines_table(tmp_path)


def test_the_developer_docs_hold_this_checkouts_lines_table():
    """docs/DEVELOPING.md's "where the lines are" table is the script's for this tree: growth shows in review.
    After a change that moves a figure: ``python -m scripts.structure_report --lines --write``."""
    assert table_in((ROOT / DEVELOPING).read_text()) == lines_table(ROOT), (
        "docs/DEVELOPING.md's lines table is not this tree's: python -m scripts.structure_report --lines --write"
    )


def test_write_puts_the_table_between_the_markers_and_leaves_the_rest(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "train.py").write_text("pass\n")
    docs = tmp_path / DEVELOPING
    start, end = (
        "<!-- the lines table: python -m scripts.structure_report --lines --write -->",
        "<!-- end of the lines table -->",
    )
    docs.write_text(f"# before\n\n{start}\n| old |\n{end}\n\nafter\n")
    assert main(["--root", str(tmp_path), "--lines", "--write"]) == 0
    text = docs.read_text()
    assert text.startswith(f"# before\n\n{start}\n| folder |") and text.endswith(f"{end}\n\nafter\n")
    assert table_in(text) == lines_table(tmp_path) and "| old |" not in text


def test_the_folders_runs_fill_are_not_the_projects(tmp_path):
    """``make demo`` leaves data/digits and runs/demo_digits in the checkout, and a user may keep scripts there: the
    report and the parameter check count the project alone, whatever the checkout holds."""
    for name in ("data/make_mine.py", "runs/mine/hook.py", "vitlarge/data/reader.py", "top.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    assert [p.relative_to(tmp_path).as_posix() for p in project_files(tmp_path)] == [
        "top.py",
        "vitlarge/data/reader.py",
    ]
