"""Counts in messages: ``1 process``, ``3 processes``, never ``1 processes``."""

from __future__ import annotations

IRREGULAR = {"process": "processes", "class": "classes", "batch": "batches"}


def plural(n: int, noun: str, many: str | None = None, *, grouped: bool = False) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1 (``many``, else `IRREGULAR`'s or ``noun + "s"``);
    ``grouped``: thousands separated by commas (``1,437 images``)."""
    word = noun if n == 1 else many or IRREGULAR.get(noun, noun + "s")
    return f"{n:,} {word}" if grouped else f"{n} {word}"
