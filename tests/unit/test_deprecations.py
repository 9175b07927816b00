"""Deprecations are errors in the suite's own process (conftest.py); in every process a test starts:
tests/e2e/test_process_start.py."""

from __future__ import annotations

import warnings

import pytest


def test_a_deprecation_raised_here_is_an_error():
    with pytest.raises(DeprecationWarning):
        warnings.warn("an old API", DeprecationWarning, stacklevel=1)
    with pytest.raises(FutureWarning):
        warnings.warn("an API about to change", FutureWarning, stacklevel=1)
