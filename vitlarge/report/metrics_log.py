"""Where a run's records live and how to read them back: ``<workdir>/metrics.jsonl``.

`hooks.jsonl.JsonlHook` writes the file; this module is the one reader, used by the summary, the
plot and the tests, so the file name and the resume rule below are written once.
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Iterator
from typing import Any

from vitlarge.fileio import open_regular

FILENAME = "metrics.jsonl"
PLOT_FILENAME = "metrics.png"
TB_DIRNAME = "tb"  # TensorBoard event files, under the workdir


STEP_MAX = 10**12  # meta.json's bound on a step; a larger one (10**400) overflows a float in the plot
LINE_MAX_BYTES = 1 << 20  # a start record holds the run's config: a few kB; a longer line is not one of ours


def records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of ``path`` as written, every attempt's, in file order. Lines that hold no record of ours
    are skipped: a partial line from a killed writer, a line longer than `LINE_MAX_BYTES` (never held whole),
    one that is not JSON (its nesting too deep included) or has no text ``event`` and (but for ``end``) no
    integer ``step`` in 0..`STEP_MAX`."""
    loads = json.loads
    with open_regular(os.fspath(path)) as f:  # a FIFO or device under the name: UnsafeFile (an OSError), not a hang
        while line := f.readline(LINE_MAX_BYTES + 1):
            if len(line) > LINE_MAX_BYTES:
                while line and not line.endswith(b"\n"):  # the rest of the overlong line
                    line = f.readline(LINE_MAX_BYTES + 1)
                continue
            try:
                rec = loads(line.decode())  # decoded here: json's own detection of the encoding costs a third more
            except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                continue
            if type(rec) is dict and type(rec.get("event")) is str:
                step = rec.get("step", 0)
                if (type(step) is int and 0 <= step <= STEP_MAX) or rec["event"] == "end":
                    yield rec


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The records of ``path`` as the final run history sees them, in file order.

    A resumed run restarts at its checkpoint's step and logs the following steps again. So a
    ``start`` record at step S drops the earlier ``train``/``eval``/``checkpoint`` records with
    step > S (they belong to the rolled-back attempt), and of records with the same event and
    step only the last is kept. ``start``/``end`` records are all kept. Lines that hold no record
    of ours are skipped (`records`).

    One pass in O(n log n): the records a start drops come off a heap by step, each at most once, so a
    handed-over file of many start records costs what any other file of its size does.
    """
    kept: list[dict[str, Any] | None] = []  # None: dropped by a later start or a later record of its step
    by_step: list[tuple[int, int]] = []  # (-step, index) of the kept step records: a max-heap of their steps
    latest: dict[tuple[str, int], int] = {}  # (event, step) -> index of its latest record
    push, pop = heapq.heappush, heapq.heappop
    for rec in records(path):
        event, step = rec["event"], rec.get("step", 0)
        if event == "start":
            while by_step and -by_step[0][0] > step:
                kept[pop(by_step)[1]] = None
        elif event != "end":
            earlier = latest.get((event, step))
            if earlier is not None:
                kept[earlier] = None
            latest[(event, step)] = len(kept)
            push(by_step, (-step, len(kept)))
        kept.append(rec)
    return [r for r in kept if r is not None]


VALUE_MAX = 1e30
"""The largest magnitude `value` reads: far above any loss, rate, accuracy or throughput of a run, and far enough
below a float's range (1.8e308) that the sums and scalings of the summary and the picture stay finite."""


def value(x: object) -> float | None:
    """A record's number as a float, or None where it has none to show: missing, null (`hooks.jsonl.JsonlHook`
    writes a non-finite value so), text, a bool, or beyond +-`VALUE_MAX` (a 400-digit integer, 1.7e308: no run's
    value, and they overflow what is drawn or printed from them). A line from elsewhere is data: the readers
    skip such a value rather than fail on it."""
    if type(x) is int:
        return float(x) if -VALUE_MAX <= x <= VALUE_MAX else None
    if type(x) is float:
        return x if -VALUE_MAX <= x <= VALUE_MAX else None  # nan fails both comparisons
    return None
