"""Durable files: the one fsync, the one atomic write and the one checksum that vitlarge publishes with.

Contract: a file or folder is *published* by renaming it into its final name after its bytes and
the names inside it are on disk (fsync of each file, then of the folder), and the rename itself is
made durable by an fsync of the parent folder. A crash (kill -9, node failure, power loss) then
leaves either the old state or the complete new one, never a final name over missing bytes.

Checksums are CRC32C (Castagnoli) through the ``crc32c`` package, which uses the CPU's CRC
instruction: 15 GB/s on the 2-core AMD EPYC test host against 3.7 GB/s for ``zlib.crc32`` and
1.6 GB/s for SHA-256 (256 MiB buffer, one core). The threat is torn or truncated writes and media
errors, not an adversary, so a 32-bit CRC is enough and reading a checkpoint back costs little
next to writing it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

CHUNK = 16 << 20  # bytes read at a time while checksumming


def fsync_path(path: str | Path) -> None:
    """Makes a file's bytes, or the names in a folder (creations, renames, removals), durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Makes the names in folder ``path`` durable (`fsync_path`, named for what it is used on)."""
    fsync_path(path)


def write_atomic(path: str | Path, data: bytes | str, *, rename: bool = True) -> None:
    """Writes ``path`` through ``<path>.tmp``: fsync, rename, fsync of the folder. Readers see the old
    file or the new one; on failure the ``.tmp`` is removed and the error raised (an OSError that
    names no file names the ``.tmp``). ``rename=False`` stops after the fsync and leaves the ``.tmp``
    for the caller to publish together with other files (a shard and its index)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if rename:
            os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not e.filename and e.errno is not None:
            raise OSError(e.errno, e.strerror, str(tmp)) from None
        raise
    if rename:
        fsync_dir(path.parent)


def sync_and_record(path: str | Path) -> dict:
    """Fsyncs a file written by someone else (torch.save, safetensors) and returns its record:
    ``{"bytes": size, "crc32c": "8 hex digits"}``, the checksum taken from what was written."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        return _record(f)


def _record(f) -> dict:
    import crc32c  # here, not at module load: the GPU kit writes through this module on machines without it

    crc, size = 0, 0
    while chunk := f.read(CHUNK):
        crc = crc32c.crc32c(chunk, crc)
        size += len(chunk)
    return {"bytes": size, "crc32c": f"{crc:08x}"}


def size_problem(path: str | Path, record: dict | None) -> str | None:
    """Why ``path`` cannot hold what ``record`` describes, from its size alone (a stat), or None."""
    path = Path(path)
    problem = regular_file_problem(path)  # a symlink out, a FIFO or a device is never read
    if problem:
        return problem
    size = os.lstat(path).st_size
    if record is None:  # written before records existed: only emptiness can be seen
        return f"{path.name} is empty" if size == 0 else None
    if size != record["bytes"]:
        return f"{path.name} has {size:,} bytes, meta.json records {record['bytes']:,}"
    return None


def record_problem(path: str | Path, record: dict | None) -> str | None:
    """Why ``path`` does not match ``record`` (size, then CRC32C over every byte), or None."""
    problem = size_problem(path, record)
    if problem or record is None:
        return problem
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            actual = _record(f)
    except OSError as e:
        return f"{Path(path).name} cannot be read ({e.strerror})"
    if actual != record:
        return f"{Path(path).name} has CRC32C {actual['crc32c']}, meta.json records {record['crc32c']}"
    return None


def read_regular(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes``, read as data from elsewhere: a
    symlink, a FIFO or a device is refused before a byte is read (``O_NOFOLLOW | O_NONBLOCK``: opening
    a FIFO never waits for a writer), and so is a larger file (``/dev/zero`` or an 8 GB sparse file
    cannot fill memory). Raises OSError (ENOENT, ELOOP for a symlink) or ValueError saying what it is."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError("is a symbolic link (refused: a file from elsewhere must be inside its folder)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("is not a regular file (a FIFO, device or folder)")
        if st.st_size > max_bytes:
            raise ValueError(f"has {st.st_size:,} bytes, more than the {max_bytes:,} such a file may have")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:  # grew while read
            raise ValueError(f"has more than the {max_bytes:,} bytes such a file may have")
        return data
    finally:
        os.close(fd)


def regular_file_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a regular file of its own folder (a symlink, FIFO, device, folder, missing), or None.
    A ``lstat``: the name itself, never what a link points to."""
    import stat

    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path.name} is missing"
    except OSError as e:
        return f"{path.name} cannot be read ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path.name} is a symbolic link (refused: every file must be inside the folder itself)"
    if not stat.S_ISREG(st.st_mode):
        return f"{path.name} is not a regular file"
    return None
