"""Done-records: what the converter leaves per committed shard in ``OUT/.progress/``, and the check
that a folder's shards come from one conversion.

A done-record (``.progress/<shard>.json``) says what the shard holds (records, bytes, checksum), the
digest of its inputs (so a rerun keeps it only when nothing changed) and the ``conversion`` it belongs
to: a digest of the whole shard plan, the same for a killed run and its resumption, different when
the images, the shard counts, the seed or the options change. A re-conversion that stops part-way
(a bad image) leaves shards of two conversions under the same names; `mixture_problem` names both
so that ``make_index`` refuses to index the mixture (which would train on some images twice and
never on others).
"""

from __future__ import annotations

import hashlib
import json
import os

from vitlarge.fileio import check_inside, read_capped

PROGRESS_DIR = ".progress"
RECORD_CAP = 16 << 20  # bytes; a record lists its shard's skipped images, a few hundred bytes each


def record_path(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, PROGRESS_DIR, name + ".json")


def conversion_id(shard_digests: dict[str, str]) -> str:
    """The conversion a plan of shards (name -> inputs digest) makes: 12 hex digits."""
    h = hashlib.sha256()
    for name in sorted(shard_digests):
        h.update(f"{name}={shard_digests[name]}\n".encode())
    return h.hexdigest()[:12]


def read_record(out_dir: str, name: str) -> dict | None:
    """The shard's done-record, or None where there is none or it is not a readable, capped JSON object
    inside ``out_dir`` (a FIFO, a link out or an 8 GB file there reads as no record)."""
    path = record_path(out_dir, name)
    try:
        check_inside(path, out_dir)
        rec = json.loads(read_capped(path, RECORD_CAP))
    except (OSError, ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def mixture_problem(data_dir: str, shards: dict[str, tuple[int, str | None]], *, unknown: bool = True) -> str | None:
    """Why the shards ``{name: (bytes, checksum or None)}`` of ``data_dir`` are not one conversion's, or None.

    Only a folder with ``.progress/`` (the converter's output) is checked. Each shard belongs to the
    conversion its done-record names when the record matches it (bytes, and the checksum where given);
    a shard without a matching record belongs to no recorded conversion, a group of its own when
    ``unknown`` (then, with checksums, no mixture passes: every shard of the one group is byte for byte
    what that conversion wrote). More than one group is a mixture. ``unknown=False`` (sizes only, before
    reading the shards) leaves damaged shards to be named by the read."""
    if not os.path.isdir(os.path.join(data_dir, PROGRESS_DIR)):
        return None
    groups: dict[str, list[str]] = {}
    sources: dict[str, str] = {}
    for name in sorted(shards):
        size, checksum = shards[name]
        rec = read_record(data_dir, name)
        key = "?"
        if rec is not None and rec.get("bytes") == size and (checksum is None or rec.get("checksum") == checksum):
            key = str(rec.get("conversion", "from an older converter"))
            sources.setdefault(key, str(rec.get("src", "")))
        if key != "?" or unknown:
            groups.setdefault(key, []).append(name)
    if len(groups) < 2:
        return None

    def label(key: str) -> str:
        if key == "?":
            return "of no recorded conversion"
        src = f" from {sources[key]}" if sources.get(key) else ""
        return f"of conversion {key}{src}"

    parts = [
        f"{len(names)} {label(key)} ({names[0]}{', ...' if len(names) > 1 else ''})"
        for key, names in sorted(groups.items(), key=lambda kv: kv[1][0])
    ]
    return f"holds shards of {len(groups)} conversions under one set of names: " + " and ".join(parts)
