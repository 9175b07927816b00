"""Where a run's records live and how to read them back: ``<workdir>/metrics.jsonl``.

`hooks.jsonl.JsonlHook` writes the file; this module is the one reader, used by the summary, the
plot and the tests, so the file name and the resume rule below are written once.
"""

from __future__ import annotations

import json
from typing import Any

FILENAME = "metrics.jsonl"
PLOT_FILENAME = "metrics.png"
TB_DIRNAME = "tb"  # TensorBoard event files, under the workdir


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The records of ``path`` as the final run history sees them, in file order.

    A resumed run restarts at its checkpoint's step and logs the following steps again. So a
    ``start`` record at step S drops the earlier ``train``/``eval``/``checkpoint`` records with
    step > S (they belong to the rolled-back attempt), and of records with the same event and
    step only the last is kept. ``start``/``end`` records are all kept. Lines that do not parse
    (a partial line from a killed writer) are skipped.
    """
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(rec, dict):
                continue
            if rec.get("event") == "start":
                s = rec.get("step", 0)
                records = [r for r in records if r.get("event") in ("start", "end") or r.get("step", 0) <= s]
            records.append(rec)
    last: dict[tuple, int] = {}
    for i, r in enumerate(records):
        if r.get("event") not in ("start", "end"):
            last[(r.get("event"), r.get("step"))] = i
    return [
        r
        for i, r in enumerate(records)
        if r.get("event") in ("start", "end") or last[(r.get("event"), r.get("step"))] == i
    ]
