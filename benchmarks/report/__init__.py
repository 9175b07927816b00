"""docs/PERFORMANCE.md and its plots, generated from benchmarks/results (`performance.generate`).

    python -m benchmarks.report          # after a benchmark (or the GPU kit's gpu.json) wrote new results

Kept apart from the measurements: it reads result files and writes the document, it times nothing.
The GPU kit's section comes from `benchmarks.gpu.report`, which the kit also writes as ``gpu.md``.
"""
