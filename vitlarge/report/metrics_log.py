"""Where a run's records live and how to read them back: ``<workdir>/metrics.jsonl``.

`hooks.jsonl.JsonlHook` writes the file; this module is the one reader, used by the summary, the
plot and the tests, so the file name and the resume rule below are written once.
"""

from __future__ import annotations

import heapq
import json
import os
from collections import deque
from collections.abc import Iterator
from typing import Any

from vitlarge.fileio import open_regular

FILENAME = "metrics.jsonl"
PLOT_FILENAME = "metrics.png"
TB_DIRNAME = "tb"  # TensorBoard event files, under the workdir


STEP_MAX = 10**12  # meta.json's bound on a step; a larger one (10**400) overflows a float in the plot
LINE_MAX_BYTES = 1 << 20  # a start record holds the run's config: a few kB; a longer line is not one of ours


STEP_EVENTS = ("train", "eval", "checkpoint")
"""The records of a step, one kept per step (`read_metrics`); ``start`` and ``end`` are the others of ours."""
KEEP_RECORDS = 20_000
"""The most records `read_metrics` keeps of one event (and of ``start``/``end`` together): far more points than a
picture's width, and a summary needs only the last. A longer run's (or a crafted file's) ``train`` records are
thinned to every 2nd, 4th, ... step, its newest always kept: 48 MiB of minimal records added ~1 GB to the summary
and the plot when every one was kept."""
KEEP_BYTES = 8 << 20
"""The most bytes of lines `read_metrics` keeps of one event: with `KEEP_RECORDS`, an absolute bound on what any
file costs (a real train record is ~250 bytes; lines of up to `LINE_MAX_BYTES` each would otherwise add up)."""


def records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of ``path`` as written, every attempt's, in file order. Lines that hold no record of ours
    are skipped: a partial line from a killed writer, a line longer than `LINE_MAX_BYTES` (never held whole),
    one that is not JSON (its nesting too deep included) or has no text ``event`` and (but for ``end``) no
    integer ``step`` in 0..`STEP_MAX`."""
    for rec, _ in _sized_records(path):
        yield rec


def _sized_records(path: str | os.PathLike[str]) -> Iterator[tuple[dict[str, Any], int]]:
    """`records`, each with the length of its line."""
    loads = json.loads
    with open_regular(os.fspath(path)) as f:  # a FIFO or device under the name: UnsafeFile (an OSError), not a hang
        while line := f.readline(LINE_MAX_BYTES + 1):
            if len(line) > LINE_MAX_BYTES:
                while line and not line.endswith(b"\n"):  # the rest of the overlong line
                    line = f.readline(LINE_MAX_BYTES + 1)
                continue
            if b'"event"' not in line:  # no record of ours: not parsed (16M lines of {} took a minute)
                continue
            try:
                rec = loads(line.decode())  # decoded here: json's own detection of the encoding costs a third more
            except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                continue
            if type(rec) is dict and type(rec.get("event")) is str:
                step = rec.get("step", 0)
                if (type(step) is int and 0 <= step <= STEP_MAX) or rec["event"] == "end":
                    yield rec, len(line)


class _Kept:
    """What `read_metrics` keeps: records by their line number (a dict keeps file order), the latest of each
    (event, step), each event's count and bytes and the stride its records are thinned to."""

    def __init__(self, keep: int, keep_bytes: int):
        self.keep, self.keep_bytes = keep, keep_bytes
        self.items: dict[int, tuple[dict[str, Any], int]] = {}  # line number -> (record, its line's bytes)
        self.latest: dict[tuple[str, int], int] = {}
        self.count: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.stride: dict[str, int] = {}
        self.tail: dict[str, int] = {}  # event -> its newest record, kept off its stride

    def add(self, seq: int, rec: dict[str, Any], size: int, group: str) -> None:
        self.items[seq] = (rec, size)
        self.count[group] = self.count.get(group, 0) + 1
        self.bytes[group] = self.bytes.get(group, 0) + size

    def remove(self, seq: int) -> None:
        found = self.items.pop(seq, None)
        if found is None:
            return
        rec, size = found
        group = _group(rec["event"])
        self.count[group] -= 1
        self.bytes[group] -= size
        key = (rec["event"], rec.get("step", 0))
        if self.latest.get(key) == seq:
            del self.latest[key]

    def over(self, group: str) -> bool:
        return self.count.get(group, 0) > self.keep or self.bytes.get(group, 0) > self.keep_bytes


def _group(event: str) -> str:
    return event if event in STEP_EVENTS else "start/end"


def read_metrics(path: str, keep: int = KEEP_RECORDS, keep_bytes: int = KEEP_BYTES) -> list[dict[str, Any]]:
    """The records of ``path`` as the final run history sees them, in file order.

    A resumed run restarts at its checkpoint's step and logs the following steps again. So a
    ``start`` record at step S drops the earlier ``train``/``eval``/``checkpoint`` records with
    step > S (they belong to the rolled-back attempt), and of records with the same event and
    step only the last is kept. ``start``/``end`` records are all kept. Lines that hold no record
    of ours (and records of other events) are skipped (`records`).

    Bounded whatever the file holds: past ``keep`` records or ``keep_bytes`` of lines of one event, its records
    are thinned to every 2nd step (then 4th, ...: its newest always kept), and the oldest ``start``/``end``
    records but the first ``start`` are dropped (`KEEP_RECORDS`, `KEEP_BYTES`).

    One pass in O(n log n): the records a start drops come off a heap by step, each at most once, so a
    handed-over file of many start records costs what any other file of its size does.
    """
    kept = _Kept(keep, keep_bytes)
    by_step: list[tuple[int, int]] = []  # (-step, line) of the kept step records: a max-heap of their steps
    marks: deque[int] = deque()  # the start and end records after the first start
    first_start = True
    push, pop = heapq.heappush, heapq.heappop
    for seq, (rec, size) in enumerate(_sized_records(path)):
        event, step = rec["event"], rec.get("step", 0)
        if event == "start":
            while by_step and -by_step[0][0] > step:
                kept.remove(pop(by_step)[1])
        if event in ("start", "end"):
            kept.add(seq, rec, size, "start/end")
            if not (first_start and event == "start"):
                marks.append(seq)
            first_start = first_start and event != "start"
            while kept.over("start/end") and marks:
                kept.remove(marks.popleft())
            continue
        if event not in STEP_EVENTS:
            continue
        earlier = kept.latest.get((event, step))
        if earlier is not None:
            kept.remove(earlier)
        if (tail := kept.tail.pop(event, None)) is not None:  # superseded as the newest
            kept.remove(tail)
        kept.add(seq, rec, size, event)
        kept.latest[(event, step)] = seq
        push(by_step, (-step, seq))
        while kept.over(event):
            kept.stride[event] = stride = kept.stride.get(event, 1) * 2
            thin = [s for s, (r, _) in kept.items.items() if r["event"] == event and r.get("step", 0) % stride]
            for s in thin:
                if s != seq:
                    kept.remove(s)
            if len(thin) <= 1 and kept.over(event):  # nothing left to thin: its newest alone is over
                break
        if step % kept.stride.get(event, 1):
            kept.tail[event] = seq
        if len(by_step) > 2 * len(kept.items) + 1024:  # entries of records since dropped: rebuilt from the kept
            by_step = [(-r.get("step", 0), s) for s, (r, _) in kept.items.items() if r["event"] in STEP_EVENTS]
            heapq.heapify(by_step)
    return [r for r, _ in kept.items.values()]


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
