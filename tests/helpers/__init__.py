"""Shared test helpers: process groups, spawned workers, train.py launchers, data fixtures, test-only entry points.

ROOT               the repository root (train.py, recipes/); the working directory of every run
process_group      a gloo group of one in this process (fixture and context manager)
spawn              N gloo worker processes (torch.multiprocessing), bounded by a deadline
launcher           train.py as users start it (python, torchrun, colossalai run); process trees
processes          what every started process shares: its environment, its tree's kill (launcher and forked)
runs               shared train.py run arguments, a reference run, an srun stand-in (e2e tests)
controllers        scripts/k8s/'s manifests as Kubeflow's controllers make them into pods (command, variables)
data_fixtures      tiny ImageFolder and the demo digits data (pytest fixtures, loaded by conftest.py)
events             a run's RunInfo, step and eval metrics made by hand, for driving hooks
tiny_model         the demo ViT with LAMB and a loss scaler, trained a step or two
precision          LayerNormDtypes: the dtypes a forward's LayerNorms compute in
kill_convert       ``python -m tests.helpers.kill_convert``: the converter SIGKILLed mid-shard
poison_train       ``python tests/helpers/poison_train.py``: train.py with inf batches at given steps
block_imports      ``python tests/helpers/block_imports.py``: a module run with packages unimportable
run_module         ``python -m MODULE ARGS`` from ROOT, its output captured (a data tool's or vitlarge's CLI)
call_main          ``MODULE.main(ARGS)`` in this process, its output captured: run_module's result, no process
fuzz_files         ``python -m tests.helpers.fuzz_files``: random mutations of the files read from elsewhere
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def run_module(module: str, *args: str, env: dict | None = None, preexec_fn=None) -> subprocess.CompletedProcess:
    """``python -m module args`` in ROOT with this interpreter, output captured, at most 120 s."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, **(env or {})),
        preexec_fn=preexec_fn,
    )


def call_main(module: str, *args: str) -> subprocess.CompletedProcess:
    """``module.main(args)`` in this process, what ``python -m module args`` runs, with what it prints to
    ``sys.stdout``/``sys.stderr`` captured: `run_module`'s result without starting an interpreter (tests/unit
    starts no process). A SystemExit (argparse's usage error) gives its status."""
    import contextlib
    import importlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = importlib.import_module(module).main(list(args))
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess([module, *args], status, out.getvalue(), err.getvalue())
