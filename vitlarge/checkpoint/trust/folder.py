"""A checkpoint folder as a whole: `verify`, the one check every reader of a checkpoint's files runs first.

The automatic resume and ``--resume`` (rank 0, in `vitlarge.checkpoint.resume`), ``vitlarge.evaluate``,
``model.init_from`` and `vitlarge.checkpoint.weights.load_model_weights` (through `weights.weights_of`, the one
reader of a checkpoint's weights) all run it before they read a byte of weights, so a checkpoint one of them
refuses is refused by all.
"""

from __future__ import annotations

from pathlib import Path

from vitlarge import fileio
from vitlarge.checkpoint.trust import index as dcp_index
from vitlarge.checkpoint.trust import meta as meta_json


def verify(path: str | Path) -> str | None:
    """Why ``path`` is not a usable checkpoint, or None when it is a folder of its own (not a symbolic link: a
    ``checkpoints/step_*`` link would take every read, and the resume's hard links, to wherever it points; a path
    the user names, ``--resume``, ``--checkpoint``, ``model.init_from``, is resolved once by its caller first),
    meta.json parses and every file it lists has its recorded size and CRC32C, and (format 3) DCP's index reads as
    data and every byte range it names lies inside a listed file (`dcp_index.slices_problem`). Reads every byte
    (at 15 GB/s for the checksum itself)."""
    path = Path(path)
    if path.is_symlink():
        return f"{path.name} is a symbolic link, never followed: a checkpoint is a folder of its own"
    found = meta_json.read(path)
    if found.meta is None:
        return found.problem
    meta = found.meta
    for name, record in meta_json.expected_files(meta).items():
        problem = fileio.record_problem(path / name, record)
        if problem:
            return problem
    if meta["format_version"] >= 3:  # the index is a pickle: read as data, and every range it names checked
        try:
            return dcp_index.slices_problem(path, dcp_index.read_index(path, meta["files"]))
        except dcp_index.IndexProblem as e:
            return str(e)
    return None
