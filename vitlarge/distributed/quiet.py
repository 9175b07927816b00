"""Lines our dependencies print on every run that tell the user nothing, each silenced where it is made.

* ``TypedStorage is deprecated``: torch's own DCP writer (torch/distributed/checkpoint/filesystem.py) calls
  ``tensor.storage()`` for every tensor it saves: torch warns once per process, so every rank at its first
  checkpoint, and again at every rerun. A ``UserWarning``, so
  the suite's DeprecationWarning-as-error (conftest.py) does not catch it; ignored from that module only.
* ``[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1``: gloo's C++
  writes it to stdout (fd 1, no switch in torch 2.10's build) on every rank as the process group forms,
  interleaved with the run's lines. `gloo_connected_lines_dropped` holds fd 1 meanwhile and passes on
  everything else, a rank that is *not* fully connected included.

Launch's `quiet_imports` keeps the import-time warnings of Colossal-AI and bitsandbytes. Not ours to silence:
``No CUDA runtime is found, using CUDA_HOME='/usr/local'`` (logged by torch/utils/cpp_extension.py) comes from
the ``colossalai run`` launcher's own process, whose CLI imports that module (for ``colossalai check``) on a
machine with a CUDA toolkit and no GPU; the training processes never import it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator

GLOO_CONNECTED = re.compile(
    rb"\[Gloo\] Rank \d+ is connected to (\d+) peer ranks\. Expected number of connected peer ranks is : \1\r?\n"
)
"""gloo's line for a rank connected to every peer (a shortfall, a different count, is kept)."""


def quiet_checkpoint_writer() -> None:
    """The TypedStorage warning of torch's checkpoint writer, for this process (any time before a save)."""
    warnings.filterwarnings(
        "ignore",
        message="TypedStorage is deprecated",
        category=UserWarning,
        module=r"torch\.distributed\.checkpoint\.filesystem",
    )


@contextlib.contextmanager
def gloo_connected_lines_dropped() -> Iterator[None]:
    """While the process group forms: fd 1 goes to a temporary file, then all of it but gloo's
    fully-connected lines goes to stdout (in order, after the block)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 1)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            held.seek(0)
            kept = memoryview(b"".join(line for line in held if not GLOO_CONNECTED.fullmatch(line)))
            with contextlib.suppress(OSError):  # a gone reader must not change the exit status
                while kept:
                    kept = kept[os.write(1, kept) :]
