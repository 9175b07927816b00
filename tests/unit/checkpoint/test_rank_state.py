"""A rank file's RNG states are data: every value `rank_state_problem` passes, `RngState.load_state_dict` takes without
an exception (a value it accepts and numpy then refuses would be a traceback, not the one-line refusal)."""

import numpy as np
import pytest

from vitlarge.checkpoint.state import RngState
from vitlarge.checkpoint.trust.torch_files import rank_state_problem


def state_with(**numpy_fields) -> dict:
    rng = RngState().state_dict()
    rng["numpy"].update(numpy_fields)
    return {"rng": rng, "scaler": {}, "data": None}


def test_a_state_as_saved_passes_and_restores():
    state = state_with()
    assert rank_state_problem(state) is None
    RngState().load_state_dict(state["rng"])


@pytest.mark.parametrize("has_gauss", [2, 2**63, 10**20, -(10**12)])
def test_a_numpy_gauss_flag_other_than_0_or_1_is_malformed(has_gauss):
    """Found by the fuzz (tests/helpers/fuzz_files.py, seed 7, rank-file case 536): numpy raised OverflowError."""
    assert rank_state_problem(state_with(has_gauss=has_gauss)) == "holds a malformed numpy RNG state"


@pytest.mark.parametrize("has_gauss", [0, 1])
def test_the_gauss_flags_numpy_writes_pass_and_restore(has_gauss):
    state = state_with(has_gauss=has_gauss, cached_gaussian=0.5)
    assert rank_state_problem(state) is None
    RngState().load_state_dict(state["rng"])
    assert np.random.get_state()[3] == has_gauss
