"""Shared test helpers: process groups, spawned workers, train.py launchers, data fixtures, test-only entry points.

ROOT               the repository root (train.py, recipes/); the working directory of every run
process_group      a gloo group of one in this process (fixture and context manager)
spawn              N gloo worker processes (torch.multiprocessing), bounded by a deadline
launcher           train.py as users start it (python, torchrun, colossalai run); process trees
runs               shared train.py run arguments, a reference run, an srun stand-in (e2e tests)
data_fixtures      tiny ImageFolder and the demo digits data (pytest fixtures, loaded by conftest.py)
tiny_model         the demo ViT with LAMB and a loss scaler, trained a step or two
precision          LayerNormDtypes: the dtypes a forward's LayerNorms compute in
kill_convert       ``python -m tests.helpers.kill_convert``: the converter SIGKILLed mid-shard
poison_train       ``python tests/helpers/poison_train.py``: train.py with inf batches at given steps
block_imports      ``python tests/helpers/block_imports.py``: a module run with packages unimportable
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
