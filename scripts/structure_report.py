"""The structure figures of the code (issue 34's closing note): annotations, the longest functions and their
parameter counts, and the call sites that must stay few. Static: it parses vitlarge/ and hooks/, imports nothing.

    python -m scripts.structure_report [--top 10] [--root .]

Run it at two commits (``git worktree add``) to compare; pyright (``make typecheck``), import-linter
(``lint-imports``) and ``duplicates`` give the rest of the picture.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

PACKAGES = ("vitlarge", "hooks")
CALLS = ("resolve_phases", "resolve_settings")
"""Functions that should be called from few places: phases are resolved once per plan, settings once per run."""


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
            named += [x for x in (a.vararg, a.kwarg) if x is not None]
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
    store = root / "vitlarge" / "checkpoint" / "store.py"
    if store.is_file():
        out.append(f"vitlarge/checkpoint/store.py: {len(store.read_text().splitlines())} lines")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    p.add_argument("--top", type=int, default=10)
    args = p.parse_args(argv)
    print("\n".join(report(args.root, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
