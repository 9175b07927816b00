"""Runs a module as ``python -m`` would, with some packages made unimportable (a real import failure).

    python tests/helpers/block_imports.py colossalai,nvidia.dali,tfrecord,crc32c benchmarks.gpu --device cpu --tiny

A finder first on ``sys.meta_path`` raises ImportError for each named package and its submodules,
as on a machine where they are not installed, so the run proves that nothing it does needs them.
The working directory is the first entry of ``sys.path``, as with ``python -m``.
"""

from __future__ import annotations

import os
import runpy
import sys


class Blocker:
    def __init__(self, names: list[str]):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if any(name == n or name.startswith(n + ".") for n in self.names):
            raise ImportError(f"blocked by tests/helpers/block_imports.py: {name}")
        return None


if __name__ == "__main__":
    blocked, module, *args = sys.argv[1:]
    sys.meta_path.insert(0, Blocker(blocked.split(",")))
    sys.path[0] = os.getcwd()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
