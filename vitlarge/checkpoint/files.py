"""Writing a checkpoint's torch files, and saying in a few words why one cannot be read or written.

Reading them, as data from elsewhere, is vitlarge/checkpoint/trust/torch_files.py's.
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException

FULL_BELOW_BYTES = 1 << 20
"""A failed write with less free space than this in its folder is reported as a full disk."""

NOT_DATA = "holds objects other than tensors and numbers (refused)"
"""Why a checkpoint file that ``torch.load(weights_only=True)`` refused is unusable: torch's own message advises
loading it anyway (``weights_only=False``, "only if you trust the source"), never passed on."""


def reason_of(error: BaseException, written_in: Path | None = None) -> str:
    """The OSError behind ``error`` if there is one ("No space left on device"), `NOT_DATA` for a read that
    ``weights_only`` refused (an UnpicklingError: torch's advice to unpickle it anyway is never passed on), else its
    first line.

    ``written_in``: the folder a failed write went to. DCP gathers each rank's failure across the
    ranks by pickling it, which drops the OSError a full disk raised (only torch's "unexpected pos"
    is left), so a folder with under `FULL_BELOW_BYTES` free is reported as full, as it is."""
    if isinstance(error, CheckpointException) and error.failures:  # DCP: the first failing rank's own error
        error = next(iter(error.failures.values()))[0]
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        if isinstance(cause, pickle.UnpicklingError):
            return f"its data {NOT_DATA}"
        cause = cause.__cause__ or cause.__context__
    if written_in is not None:
        try:
            if shutil.disk_usage(written_in).free < FULL_BELOW_BYTES:
                return os.strerror(errno.ENOSPC)
        except OSError:
            pass
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def torch_save(obj, path: Path) -> None:
    # Through a Python file, so a full disk's OSError is kept as the context of torch's RuntimeError
    # (whose own message, "unexpected pos ...", does not say why).
    with open(path, "wb") as f:
        torch.save(obj, f)
