"""Kept for callers that name this path: runs tests/helpers/block_imports.py with the same arguments."""

import runpy
from pathlib import Path

if __name__ == "__main__":
    runpy.run_path(str(Path(__file__).resolve().parent / "helpers" / "block_imports.py"), run_name="__main__")
