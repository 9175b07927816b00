"""The workdir accepts checkpoints: writable on every rank, and the same folder on every node.

Both checks run before any work (`vitlarge.checkpoint.checkpointer.Checkpointer.check_workdir`, which vitlarge/run/job.py
calls), so a read-only mount or a mount missing on one node
fails in one line at the start, not at the first save.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from vitlarge import fileio
from vitlarge.checkpoint.trust.layout import CHECKPOINTS_DIR
from vitlarge.errors import UserError


def check_writable(workdir: str | Path, rank: int) -> None:
    """Every rank, before any work: the workdir (created if missing) and its checkpoints folder (if
    there is one) accept a new file, so a read-only mount fails now in one line, not at the first save."""
    workdir = Path(workdir)
    for folder, what in ((workdir, "workdir"), (workdir / CHECKPOINTS_DIR, "checkpoint folder")):
        if what != "workdir" and folder.is_symlink():  # a handed-over workdir's link would take the writes elsewhere
            raise UserError(
                f"{folder} is a symbolic link (to {os.readlink(folder)}); vitlarge writes checkpoints only inside the "
                "workdir: remove the link, or pass --workdir on the file system it pointed to"
            )
        if what != "workdir" and not folder.is_dir():
            continue
        probe = folder / f".write_test_{rank}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fileio.probe_writable(folder, probe.name)  # a planted link is removed, never followed
        except OSError as e:
            fix = (
                "pass a writable --workdir"
                if what == "workdir"
                else "make it writable or pass another "
                "--workdir (--resume may still read a checkpoint from a read-only place)"
            )
            raise UserError(f"{what} {folder} is not writable ({e.strerror}); {fix}") from None


SHARED_PROBE = ".vitlarge_shared_probe"


def write_shared_probe(workdir: str | Path) -> str:
    """Rank 0, after `check_writable`: a file with a token no other run writes; returns the token. With
    `check_shared_probe` on every rank it shows the ranks share the workdir (a mount missing on one node
    leaves that node a local folder of the same name, and its checkpoint parts never reach the others)."""
    token = uuid.uuid4().hex
    fileio.write_atomic(Path(workdir) / SHARED_PROBE, token)
    return token


def check_shared_probe(workdir: str | Path, token: str, wait_s: float = 5.0) -> None:
    """Every rank: rank 0's probe holds ``token`` in this rank's view of ``workdir`` (polled for ``wait_s``:
    a shared file system may show another node's new file a moment late); else a one-line ``UserError``."""
    path, deadline = Path(workdir) / SHARED_PROBE, time.monotonic() + wait_s
    while True:
        try:
            if fileio.read_capped(path, 64, follow=False) == token.encode():  # a planted link or FIFO: never read
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise UserError(
                f"--workdir {workdir} here is not the folder rank 0 writes to ({SHARED_PROBE} it wrote is not there "
                "or holds another run's token): every node must see the workdir on one shared file system "
                "(is it mounted on this node?)"
            )
        time.sleep(0.2)
