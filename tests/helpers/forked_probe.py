"""``python tests/helpers/forked_probe.py [deprecate]``: what a process sees of its start, as one JSON line
(its session, seeds, warning options, main module), then, with ``deprecate``, a DeprecationWarning. Run forked and
fresh by tests/e2e/test_forked.py to show that forked ranks keep the suite's contracts."""

import json
import os
import sys
import warnings

import numpy
import torch

print(
    json.dumps(
        {
            "own_session": os.getsid(0) == os.getpid(),
            "torch_seed": torch.initial_seed(),
            "numpy_draw": float(numpy.random.random()),
            "warnoptions": sys.warnoptions,
            "main": sys.modules["__main__"].__file__,
            "rank": os.environ.get("RANK"),
        }
    ),
    flush=True,
)
if sys.argv[1:] == ["deprecate"]:
    warnings.warn("a deprecated call", DeprecationWarning, stacklevel=1)
    print("survived the deprecation", flush=True)
