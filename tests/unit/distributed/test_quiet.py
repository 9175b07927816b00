"""vitlarge/distributed/quiet.py: each dependency line it silences is gone, and only that line.

The TypedStorage warning is a ``UserWarning``, which the suite's DeprecationWarning-as-error does not turn
into a failure: recorded here instead. gloo's line is written by C++ to fd 1, so its test forms a real gloo
group of one in a fresh interpreter and reads that process's stdout: tests/e2e/test_process_start.py.
"""

from __future__ import annotations

import warnings

import torch

from tests.helpers import ROOT
from tests.helpers.tiny_model import make
from vitlarge.checkpoint import store
from vitlarge.checkpoint.state import RunState
from vitlarge.config.load import load_recipe
from vitlarge.distributed.quiet import GLOO_CONNECTED, quiet_checkpoint_writer

torch.set_num_threads(1)


def _typed_storage_warnings(tmp_path, quiet: bool) -> list[str]:
    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    model, opt, scaler = make(cfg)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # every warning, whatever an earlier test already showed
        if quiet:
            quiet_checkpoint_writer()  # in front of "always", as it is in front of the defaults in a run
        store.save(tmp_path, RunState(model, opt, scaler, step=1, data="loader-state"), cfg, keep=1)
    return [str(w.message) for w in seen if "TypedStorage is deprecated" in str(w.message)]


def test_a_checkpoint_save_warns_no_typed_storage(tmp_path, process_group):
    # torch warns once per process: on every call here, so the second save is a test of the filter.
    torch.storage._set_always_warn_typed_storage_removal(True)
    try:
        assert _typed_storage_warnings(tmp_path / "loud", quiet=False), "torch no longer warns: drop the filter"
        assert _typed_storage_warnings(tmp_path / "quiet", quiet=True) == []
    finally:
        torch.storage._set_always_warn_typed_storage_removal(False)


def test_the_filter_is_scoped_to_torchs_checkpoint_writer():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_checkpoint_writer()
        warnings.warn("TypedStorage is deprecated (from elsewhere)", UserWarning, stacklevel=1)
    assert len(seen) == 1


def test_a_rank_missing_peers_keeps_its_gloo_line():
    line = b"[Gloo] Rank 3 is connected to %d peer ranks. Expected number of connected peer ranks is : 7\n"
    assert GLOO_CONNECTED.fullmatch(line % 7) and not GLOO_CONNECTED.fullmatch(line % 6)
