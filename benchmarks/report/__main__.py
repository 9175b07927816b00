"""``python -m benchmarks.report``: regenerate docs/PERFORMANCE.md from benchmarks/results."""

from benchmarks.report.performance import main

main()
