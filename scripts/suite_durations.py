"""Where the suite's time goes: a ``pytest --durations=0`` log grouped by file and by cause, the slowest tests,
and the suite's test and assertion counts (tests/README.md keeps the table).

    python -m pytest tests -q --durations=0 > suite.log
    python -m scripts.suite_durations suite.log [--before old.log] [--top 20]

Causes are by file (`CAUSES`, first match wins): what a file's tests mostly spend their time on. The assertion
count is static (``assert`` statements and ``pytest.raises`` blocks under tests/), so that merged tests can be
checked to keep every check.
"""

from __future__ import annotations

import argparse
import ast
import collections
import re
from pathlib import Path

LINE = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(.+?)\s*$")
CAUSES = [
    ("tests/unit/", "in-process (unit tier)"),
    ("tests/e2e/test_slurm", "real Slurm (srun, sbatch, requeue)"),
    ("tests/e2e/test_launchers.py", "real launchers (colossalai run, torchrun, vitlarge.run)"),
    ("tests/e2e/test_elastic.py", "real launchers (colossalai run, torchrun, vitlarge.run)"),
    ("tests/e2e/test_install.py", "pip (install, resolve)"),
    ("tests/e2e/test_gpu_wheels.py", "pip (install, resolve)"),
    ("tests/e2e/test_compile_runs.py", "torch.compile"),
    ("tests/e2e/test_fuzz_files.py", "fuzzing (many small reads)"),
    ("tests/e2e/test_benchmarks.py", "benchmarks"),
    ("tests/e2e/reliability/test_soak.py", "long run (soak)"),
    ("tests/e2e/test_types.py", "type checker (pyright)"),
    ("tests/e2e/", "training runs (several ranks; forked since issue 32)"),
    ("tests/", "other (the GPU tier, skipped without CUDA)"),
]
ROOT = Path(__file__).resolve().parents[1]


def cause(path: str) -> str:
    return next(label for prefix, label in CAUSES if path.startswith(prefix))


def read(log: Path) -> list[tuple[float, str, str]]:
    """(seconds, phase, node id) of every duration line."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if m:
            out.append((float(m[1]), m[2], m[3]))
    return out


def totals(rows) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
    by_file, by_cause, by_test = collections.Counter(), collections.Counter(), collections.Counter()
    for seconds, _, node in rows:
        path = node.split("::")[0]
        by_file[path] += seconds
        by_cause[cause(path)] += seconds
        by_test[node] += seconds
    return by_file, by_cause, by_test


def assertion_count(root: Path = ROOT / "tests") -> tuple[int, int]:
    """(test functions, assert statements + pytest.raises blocks) under ``root``, counted from the source."""
    tests = checks = 0
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
                tests += 1
            elif isinstance(node, ast.Assert):
                checks += 1
            elif isinstance(node, ast.With | ast.AsyncWith):
                checks += sum("raises" in ast.unparse(item.context_expr).split("(")[0] for item in node.items)
    return tests, checks


def table(title: str, now: collections.Counter, before: collections.Counter | None, top: int | None) -> str:
    head = f"| {title} | s |" + (" before (s) |" if before is not None else "")
    rule = "|---|---:|" + ("---:|" if before is not None else "")
    rows = [head, rule]
    keys = [k for k, _ in now.most_common(top)]
    if before is not None and top is None:
        keys += [k for k in before if k not in now]
    for k in keys:
        row = f"| `{k}` | {now[k]:.1f} |" + (f" {before[k]:.1f} |" if before is not None else "")
        rows.append(row)
    total = f"| total | {sum(now.values()):.1f} |" + (f" {sum(before.values()):.1f} |" if before is not None else "")
    rows.append(total)
    return "\n".join(rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", type=Path, help="output of pytest --durations=0")
    p.add_argument("--before", type=Path, help="an earlier log, shown side by side")
    p.add_argument("--top", type=int, default=20, help="how many of the slowest tests to list")
    a = p.parse_args(argv)
    files, causes, tests = totals(read(a.log))
    old = totals(read(a.before)) if a.before else (None, None, None)
    print(table("cause", causes, old[1], None), end="\n\n")
    print(table("file", files, old[0], None), end="\n\n")
    print(table(f"slowest {a.top} tests (setup + call + teardown)", tests, None, a.top), end="\n\n")
    if old[2] is not None:
        print(table(f"slowest {a.top} tests before", old[2], None, a.top), end="\n\n")
    n_tests, n_checks = assertion_count()
    print(f"test functions: {n_tests}; assert statements and pytest.raises blocks: {n_checks}")


if __name__ == "__main__":
    main()
