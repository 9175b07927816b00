"""scripts/structure_report.py: the structure figures the closing notes compare (annotations, long functions,
the few call sites of resolve_phases and resolve_settings), read from a planted tree."""

from scripts.structure_report import report


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
    assert lines[5].split()[:2] == ["3", "1"] and len(lines) == 6  # no store.py in the planted tree
