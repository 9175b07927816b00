"""The path a reader follows from train.py's ``main`` to the end of the first optimizer step, as files.

    python scripts/call_path.py [--list] -- --config recipes/demo_digits.py data.source=synthetic train.max_steps=1

Runs train.py in this process (one rank, no launcher) under `sys.setprofile` and records, in the order a reader
first meets them, the project's functions (train.py, vitlarge/, hooks/) as they are first called: a function read
once is not read again, so a loop's repeated calls count once, and library code is skipped (its callbacks into
the project count where they first run). Code that runs while a module is being imported (class bodies, decorators,
module-level constants) is not a call a reader follows from ``main``; it is counted apart, in the second line, which
is the count as first measured (it included that code). A *stay* is a run of consecutive first calls in one file; a *re-entry*
is a stay in a file the path had already left. Tracing ends when the first call of ``Engine.step`` returns. Prints the counts (and
with ``--list`` the stays in order); the setup's structure is what issue 46 measured this way, before and after.
"""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = (str(ROOT / "vitlarge") + os.sep, str(ROOT / "hooks") + os.sep, str(ROOT / "train.py"))


class Done(Exception):
    """The first optimizer step returned."""


def main(argv: list[str]) -> int:
    show = "--list" in argv
    args = [a for a in argv if a not in ("--list", "--")]
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    stays: list[str] = []
    with_imports: list[str] = []
    read: set = set()

    def importing(frame) -> bool:
        if not code_flags_function(frame.f_code):
            return True
        f = frame.f_back
        while f is not None and f is not top:
            if f.f_code.co_name == "<module>":
                return True
            f = f.f_back
        return False

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "return" and code.co_name == "step" and code.co_filename.endswith("vitlarge/train/engine.py"):
            sys.setprofile(None)
            raise Done
        if event != "call" or code in read:
            return
        read.add(code)
        name = code.co_filename
        if not name.startswith(OURS) or code.co_name == "<module>":
            return
        if not with_imports or with_imports[-1] != name:
            with_imports.append(name)
        if not importing(frame) and (not stays or stays[-1] != name):
            stays.append(name)

    import train

    top = sys._getframe()
    sys.argv = ["train.py", *args]
    sys.setprofile(profile)
    try:
        train.main(args)
    except Done:
        pass
    finally:
        sys.setprofile(None)
    if show:
        print("\n".join(os.path.relpath(f, ROOT) for f in stays))
    print("call path to the first step's end: {} stays in {} files, {} re-entries".format(*count(stays)))
    print(
        "  with code run at import (classes, decorators): {} stays in {} files, {} re-entries".format(
            *count(with_imports)
        )
    )
    return 0


def code_flags_function(code) -> bool:
    """Whether ``code`` is a function's (it has its own locals), not a class body's."""
    return bool(code.co_flags & inspect.CO_NEWLOCALS)


def count(stays: list[str]) -> tuple[int, int, int]:
    """Stays, distinct files, and re-entries (stays in a file already left) of a path."""
    seen: set[str] = set()
    reentries = 0
    for f in stays:
        reentries += f in seen
        seen.add(f)
    return len(stays), len(seen), reentries


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
