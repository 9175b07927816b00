"""Reliability tests: kill -9, signals, non-finite values, bad input, soak. See docs/RELIABILITY.md.

Their shared run arguments, reference run and ``srun`` stand-in are in tests/helpers/runs.py.
"""
