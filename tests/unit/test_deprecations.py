"""Deprecations are errors in the suite's own process and in every process a test starts (conftest.py)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest


def test_a_deprecation_raised_here_is_an_error():
    with pytest.raises(DeprecationWarning):
        warnings.warn("an old API", DeprecationWarning, stacklevel=1)
    with pytest.raises(FutureWarning):
        warnings.warn("an API about to change", FutureWarning, stacklevel=1)


@pytest.mark.parametrize("category", ["DeprecationWarning", "FutureWarning"])
def test_a_deprecation_in_a_started_process_fails_it(category):
    p = subprocess.run(
        [sys.executable, "-c", f"import warnings; warnings.warn('an old API', {category}); print('went on')"],
        capture_output=True,
        text=True,
    )
    assert p.returncode != 0 and "went on" not in p.stdout and category in p.stderr


def test_only_the_named_dependency_module_is_excused():
    code = (
        "import torch.jit._script as s, warnings\n"
        "warnings.warn_explicit('old', DeprecationWarning, 'x.py', 1, module='torch.jit._script')\n"
        "warnings.warn_explicit('old', DeprecationWarning, 'x.py', 1, module='vitlarge.model.vit')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode != 0 and "DeprecationWarning: old" in p.stderr and p.stderr.count("DeprecationWarning") == 1
