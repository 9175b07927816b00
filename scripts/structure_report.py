"""The structure figures of the code: annotations, the longest functions and their parameter counts, the call sites
that must stay few, the functions over the parameter budget, and where the lines are. Static: it parses the
checkout's Python files, imports nothing.

    python -m scripts.structure_report [--top 10] [--root .]
    python -m scripts.structure_report --lines     # the "where the lines are" table of docs/DEVELOPING.md

Run it at two commits (``git worktree add``) to compare; pyright (``make typecheck``), import-linter
(``lint-imports``) and ``duplicates`` give the rest of the picture. tests/unit/test_layout.py holds the parameter
budget and that docs/DEVELOPING.md's table is this script's.
"""

from __future__ import annotations

import argparse
import ast
import os
from pathlib import Path

PACKAGES = ("vitlarge", "hooks")
CALLS = ("resolve_phases", "resolve_settings")
"""Functions that should be called from few places: phases are resolved once per plan, settings once per run."""


MANY_PARAMETERS = 8
"""A function taking more than this many values should take the spec that holds them (STYLE.md 17-19)."""
AT_MOST_MANY = 3
"""How many functions of the checkout may take more than `MANY_PARAMETERS`..."""
MOST_PARAMETERS = 12
"""... and none more than this."""

FOLDERS = {
    "train.py": "the command: parse, build the run, fit",
    "recipes": "what to train: Python files returning a Config",
    "vitlarge": "the library, how to train (with the folders below)",
    "vitlarge/config": "schema, loading recipes, overrides, checks",
    "vitlarge/plan": "phases, the plan in steps, the lr schedule, edits on resume",
    "vitlarge/optim": "LAMB (three forms), parameter groups, sharded LAMB",
    "vitlarge/model": "timm ViTs with vitlarge's options, precision, recomputation, EMA",
    "vitlarge/distributed": "launchers, process group and device, threads, network, collectives, plugins, FSDP2",
    "vitlarge/data": "DALI loaders over TFRecords, synthetic data, phased loaders, the manifest",
    "vitlarge/checkpoint": "the checkpointer: store, sharded state, resume, formats, export, init_from",
    "vitlarge/train": "assembly, settings, the engine's step, the loop, evaluation, memory, profiling",
    "vitlarge/run": "a whole run: the command's start, build_run and fit, the dry run, GPU-hours",
    "vitlarge/report": "reading a run afterwards: metrics.jsonl and its plot",
    "vitlarge/recipes": "the shipped recipes as vitlarge.recipes",
    "hooks": "observers of a run, one per file",
    "data_tools": "offline: image folders to TFRecords, index files, demo data",
    "benchmarks": "speed comparisons, one bench_*.py each (with the folders below)",
    "benchmarks/gpu": "the GPU measurement kit",
    "benchmarks/harness": "what every benchmark shares: timing, spawning, results, one bare loop",
    "benchmarks/report": "docs/PERFORMANCE.md and its plots from the results",
    "scripts": "developer tools: the suite's runner and durations, GPU bundles, this report",
    "tests": "the suite (with the folders below)",
    "tests/unit": "in-process tests, one folder per package",
    "tests/e2e": "tests that start processes",
    "tests/gpu": "the GPU tier",
    "tests/helpers": "launchers, fixtures, shared test code",
    "tests/data": "stored files written by older versions",
}
"""Each folder of the checkout that holds Python files (at most two deep: deeper ones count in their parent) and
the top-level modules: what it holds, for the lines table. A new folder needs its line here."""


DEVELOPING = Path("docs") / "DEVELOPING.md"
"""The developer docs that hold the lines table, between `TABLE_START` and `TABLE_END`."""
TABLE_START = "<!-- the lines table: python -m scripts.structure_report --lines --write -->"
TABLE_END = "<!-- end of the lines table -->"


RUN_FOLDERS = ("data", "runs")
"""The checkout's top-level folders that runs fill, not the project (``make demo``'s data set and run, a user's own;
.gitignore's ``/data/`` and ``/runs/``): never counted here, never read by a unit test (tests/unit/conftest.py)."""


def project_files(root: Path) -> list[Path]:
    """The checkout's Python files: every ``*.py`` below ``root`` outside hidden folders (the venv, ``.git``),
    ``__pycache__`` and `RUN_FOLDERS`, links not followed."""
    found = []
    for folder, dirs, files in os.walk(root):
        top = Path(folder) == root
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and d != "__pycache__" and not (top and d in RUN_FOLDERS)
        )
        found += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(found)


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every parameter but ``self`` and ``cls``; ``*args`` and ``**kwargs`` count one each (each carries values the
    reader must know to call it)."""
    a = fn.args
    named = [x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    return len(named) + sum(x is not None for x in (a.vararg, a.kwarg))


def many_parameters(root: Path) -> list[tuple[int, str]]:
    """``(parameters, "path:line name")`` of every function of the checkout over `MANY_PARAMETERS`, most first."""
    found = []
    for path in project_files(root):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameter_count(node) > MANY_PARAMETERS:
                found.append((parameter_count(node), f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name}"))
    return sorted(found, key=lambda x: (-x[0], x[1]))


def lines_table(root: Path) -> list[str]:
    """The "where the lines are" table (Markdown): per `FOLDERS` entry its Python files and their lines, a folder's
    figures including its subfolders'. Lines to the hundred, so that the table changes with growth, not with each
    edit. ValueError naming a folder with Python files that `FOLDERS` lacks."""
    counts: dict[str, list[int]] = {}
    for path in project_files(root):
        rel = path.relative_to(root)
        parts = rel.parts[:-1][:2]
        keys = [rel.as_posix()] if len(rel.parts) == 1 else ["/".join(parts[: i + 1]) for i in range(len(parts))]
        for key in keys:
            if key not in FOLDERS:
                if len(rel.parts) == 1:
                    continue  # a top-level module without a line (conftest.py): counted in the total only
                raise ValueError(f"{key}/ holds Python files but has no line in scripts/structure_report.py FOLDERS")
            figures = counts.setdefault(key, [0, 0])
            figures[0] += 1
            figures[1] += len(path.read_text().splitlines())
    out = ["| folder | files | lines | what it holds |", "|---|---:|---:|---|"]
    for key in FOLDERS:
        if key in counts:
            name = key if key.endswith(".py") else f"{key}/"
            out.append(f"| `{name}` | {counts[key][0]} | {_hundreds(counts[key][1])} | {FOLDERS[key]} |")
    files = project_files(root)
    total = sum(len(p.read_text().splitlines()) for p in files)
    out.append(f"| all | {len(files)} | {_hundreds(total)} | every Python file of the checkout |")
    return out


def _hundreds(lines: int) -> str:
    return f"{(lines + 50) // 100 * 100:,}" if lines >= 50 else "< 50"


def table_in(text: str) -> list[str]:
    """The lines table as a document holds it (between `TABLE_START` and `TABLE_END`; empty without them)."""
    if TABLE_START not in text or TABLE_END not in text:
        return []
    return text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip("\n").splitlines()


def with_table(text: str, table: list[str]) -> str:
    """``text`` with the lines table between its markers replaced by ``table``."""
    head, rest = text.split(TABLE_START, 1)
    return head + TABLE_START + "\n" + "\n".join(table) + "\n" + TABLE_END + rest.split(TABLE_END, 1)[1]


def _returns_value(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                return True
    return False


def report(root: Path, top: int) -> list[str]:
    files = sorted(p for d in PACKAGES for p in (root / d).rglob("*.py"))
    funcs: list[tuple[int, str, int]] = []
    params = annotated = no_return = inner_imports = object_annotations = 0
    calls = dict.fromkeys(CALLS, 0)
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if name in calls:
                    calls[name] += 1
            if isinstance(node, (ast.arg, ast.AnnAssign)):
                ann = node.annotation
                object_annotations += isinstance(ann, ast.Name) and ann.id == "object"
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            named = [x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
            named += [x for x in (a.vararg, a.kwarg) if x is not None]  # as `parameter_count` counts
            params += len(named)
            annotated += sum(x.annotation is not None for x in named)
            no_return += node.returns is None and node.name != "__init__" and _returns_value(node)
            inner_imports += sum(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(node))
            where = f"{path.relative_to(root)}:{node.lineno} {node.name}"
            funcs.append(((node.end_lineno or node.lineno) - node.lineno + 1, where, len(named)))
    out = [
        f"{len(files)} files, {len(funcs)} functions; parameters annotated {annotated}/{params} "
        f"({100 * annotated / max(params, 1):.1f}%); value-returning functions without a return type {no_return}; "
        f"`object` annotations {object_annotations}; imports inside functions {inner_imports}",
        *(f"calls of {name}: {n}" for name, n in calls.items()),
        f"the {top} longest functions (lines, parameters):",
    ]
    out += [f"  {n:4d} {k:3d}  {where}" for n, where, k in sorted(funcs, reverse=True)[:top]]
    many = many_parameters(root)
    out.append(
        f"functions of the checkout with more than {MANY_PARAMETERS} parameters: {len(many)} "
        f"(at most {AT_MOST_MANY}, none over {MOST_PARAMETERS})"
    )
    out += [f"  {n:3d}  {where}" for n, where in many]
    store = root / "vitlarge" / "checkpoint" / "store.py"
    if store.is_file():
        out.append(f"vitlarge/checkpoint/store.py: {len(store.read_text().splitlines())} lines")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--lines", action="store_true", help="print the lines table of docs/DEVELOPING.md instead")
    p.add_argument("--write", action="store_true", help="with --lines: write it into docs/DEVELOPING.md")
    args = p.parse_args(argv)
    if args.lines and args.write:
        from vitlarge.fileio import write_atomic

        docs = args.root / DEVELOPING
        write_atomic(docs, with_table(docs.read_text(), lines_table(args.root)))
        print(f"wrote the lines table into {docs}")
        return 0
    print("\n".join(lines_table(args.root) if args.lines else report(args.root, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
