"""Mounts a test makes from its own process (root, or CAP_SYS_ADMIN): a small tmpfs and a read-only bind mount;
`read_only`, a data folder no write can change for a block (and `snapshot`, to show none did).

mount(2) and umount2(2) through libc, the calls the ``mount`` and ``umount`` commands make, so a unit test
starts no process for them (tests/unit/conftest.py). Each raises OSError where the system refuses; the
callers skip then, as they did when the command failed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat

import pytest

MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096  # <sys/mount.h>
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _call(result: int, what: str, path) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}", str(path))


def mount_tmpfs(path, options: str) -> None:
    """``mount -t tmpfs -o OPTIONS tmpfs PATH`` (e.g. ``size=8m``, ``size=8m,nr_inodes=4``)."""
    _call(_libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", 0, options.encode()), "mount tmpfs", path)


def bind_read_only(path) -> None:
    """``mount --bind -o ro PATH PATH``: a bind mount of the folder onto itself, then remounted read-only."""
    p = os.fsencode(path)
    _call(_libc.mount(p, p, None, MS_BIND, None), "bind mount", path)
    try:
        _call(_libc.mount(p, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None), "remount read-only", path)
    except OSError:
        unmount(path)
        raise


def unmount(path, lazy: bool = False) -> None:
    """``umount PATH`` (``umount -l`` with ``lazy``: detached now, gone when the last file on it closes)."""
    _call(_libc.umount2(os.fsencode(path), MNT_DETACH if lazy else 0), "umount", path)


def snapshot(root) -> dict:
    """Every entry under ``root``: its kind, size and modification time (what a write would change)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (
                stat.S_IFMT(st.st_mode),
                st.st_size,
                st.st_mtime_ns,
            )
    return out


@contextlib.contextmanager
def read_only(folder):
    """``folder`` made read-only for the block: ``chmod -R a-w``, and where that does not stop this process (root),
    a read-only bind mount of it (`bind_read_only`); skips the test where neither can be had."""
    modes = {
        p: os.stat(p).st_mode
        for p in [str(folder)] + [os.path.join(d, n) for d, ds, fs in os.walk(folder) for n in ds + fs]
    }
    for p, mode in modes.items():
        os.chmod(p, mode & ~0o222)
    mounted = False
    try:
        if os.access(folder, os.W_OK):
            try:
                bind_read_only(folder)
            except OSError as e:
                pytest.skip(f"cannot make {folder} read-only here ({e})")
            mounted = True
        yield
    finally:
        if mounted:
            try:
                unmount(folder)
            except OSError:  # a file still open (a failed assertion's loader): detached, gone when it closes
                unmount(folder, lazy=True)
        for p, mode in modes.items():
            os.chmod(p, mode)
