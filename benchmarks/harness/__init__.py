"""What every benchmark shares: results, timing, interleaving, spawn-and-gather, recipe configs, one bare loop.

- `results`: machine description, ``--quick``/``--tiny`` command line, ``benchmarks/results/<name>.json``.
- `timing`: wall and CPU time of a call, medians, contenders interleaved round by round, matmul peak.
- `spawn`: N gloo processes that each return a JSON-able result, gathered to the caller.
- `recipe`: a recipe file with the benchmark's overrides, as one function.
- `loop`: in-memory batches, the engine as train.py builds it, and the bare PyTorch loop it is
  compared with (its optimizer a parameter).

Importing this package sets ``OMP_WAIT_POLICY=PASSIVE`` unless set: libgomp's default wait policy
spins, then sleeps; with 2 threads on 2 cores that other processes also use, a parallel region waits
for a descheduled thread: a tiny ViT step took 0.74 s instead of 0.01 s (measured, load 7). PASSIVE
makes both contenders pay the same small, steady cost. It must be set before torch loads libgomp, so
a benchmark imports the harness before torch. No module here imports vitlarge at load time: a
spawned worker may put another checkout's vitlarge first on ``sys.path`` (bench_checkpoint_io).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
