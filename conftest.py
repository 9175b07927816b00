"""Suite-wide settings: shared fixtures, tests/e2e/ marked slow, and deprecations as errors.

Fixtures from tests/helpers/: the data sets (data_fixtures) and a gloo group of one (process_group).
Every test under tests/e2e/ gets the ``slow`` marker here; ``make test-fast`` runs tests/unit/ only.

A DeprecationWarning or FutureWarning is an error in the test process and, through PYTHONWARNINGS,
in every process a test starts (train.py under torchrun, colossalai run, srun; the benchmarks), so a
deprecated call on vitlarge's own paths fails the suite. Each exception below is raised inside a
dependency where vitlarge cannot avoid it, and is matched as narrowly as the mechanism allows.
"""

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.helpers.data_fixtures", "tests.helpers.process_group", "pytester"]

DEPRECATIONS_AS_ERRORS = ["error::DeprecationWarning", "error::FutureWarning"]
DEPENDENCY_DEPRECATIONS = [
    # torch 2.10 warns from torch/jit/_script.py: its own torch/utils/mkldnn.py uses
    # torch.jit.script_method at import (reached from torch._inductor, which Colossal-AI and
    # torch.compile import), and Colossal-AI's shardformer calls torch.jit.script at import.
    # vitlarge calls neither. torch 2.15 raises the same as FutureWarning. By module:
    # PYTHONWARNINGS matches a message only from its start, and these begin with a backtick,
    # which `colossalai run` passes through a shell unquoted.
    "ignore::DeprecationWarning:torch.jit._script",
    "ignore::FutureWarning:torch.jit._script",
    # torch 2.15 deprecates DDP's broadcast_buffers; Colossal-AI's TorchDDPPlugin always passes it
    # to DDP (its configure(), so the warning is attributed to that module), and its API offers no way
    # not to. vitlarge never builds DDP itself.
    "ignore::FutureWarning:colossalai.booster.plugin.torch_ddp_plugin",
    # MLflow 3.17's SQL tracking store (log.mlflow with an sqlite:/// store, the default) configures its
    # mappers with SQLAlchemy 2.1's deprecated ``noload`` strategy (SADeprecationWarning, attributed to that module).
    "ignore::DeprecationWarning:mlflow.store.tracking.sqlalchemy_store",
]


def pytest_configure(config):
    for line in DEPRECATIONS_AS_ERRORS + DEPENDENCY_DEPRECATIONS:  # the last match wins
        config.addinivalue_line("filterwarnings", line)
    os.environ["PYTHONWARNINGS"] = ",".join(DEPRECATIONS_AS_ERRORS + DEPENDENCY_DEPRECATIONS)


E2E = Path(__file__).resolve().parent / "tests" / "e2e"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if E2E in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def victim(tmp_path):
    """A file outside the folder a test writes into, with content that must survive a planted link."""
    outside = tmp_path / "outside"
    outside.mkdir()
    v = outside / "victim"
    v.write_bytes(b"precious")
    return v
