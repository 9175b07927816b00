"""A W&B offline run read back: the records of its ``run-<id>.wandb`` file, decoded with W&B's own protobuf schema
(``wandb.proto.wandb_internal_pb2.Record``; wandb 0.31 ships no Python reader of the file, only ``wandb-core``).

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then LevelDB-log-style
32 KiB blocks of chunks (CRC32C, length, type: full, first, middle, last), each record one chunk or several.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7


def records(path: str | Path) -> list:
    from wandb.proto.wandb_internal_pb2 import Record

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), f"{path}: not a .wandb file"
    out, pos, pending = [], HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 or len(chunk) < length:  # padding, or the tail of a file whose writer was killed
            break
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
    return [Record.FromString(c) for c in out]


def read_run(run_dir: str | Path) -> dict:
    """``{"id", "history": [{"_step": n, key: value}...], "config": {key: value}, "branch_point": ...}`` of one
    offline run folder (``offline-run-<time>-<id>``), in file order."""
    (path,) = Path(run_dir).glob("run-*.wandb")
    run: dict = {"id": None, "history": [], "config": {}}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run["id"] = r.run.run_id
            for item in r.run.config.update:
                run["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in r.config.update:
                run["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in r.history.item}
            row.setdefault("_step", r.history.step.num)
            run["history"].append(row)
    return run
