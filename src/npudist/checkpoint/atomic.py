"""Linux file atomics under the checkpoint policy: durable writes (fsync of files and of the directory that
names them) and a rename that swaps two directories in one step, so a reader sees the old tree or the new
one, never half of each. Nothing here knows what a checkpoint is (store.py does)."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from pathlib import Path

RENAME_EXCHANGE = 2
"""renameat2's flag (linux/fs.h)."""
AT_FDCWD = -100
"""Paths relative to the working directory (linux/fcntl.h)."""
NO_EXCHANGE = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})
"""What exchange() raises where the kernel, the C library or the filesystem (NFS, for one) lacks it."""


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (a rename into it, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """Every file under ``path``, then ``path`` itself."""
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())
    fsync_dir(path)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def exchange(a: Path, b: Path) -> None:
    """Swap two existing names in one step (renameat2 RENAME_EXCHANGE, Linux >= 3.15, glibc >= 2.28).
    OSError with an errno in NO_EXCHANGE where it is not available."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not in this C library")
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a), None, str(b))


def replace(new: Path, final: Path, aside: Path) -> None:
    """Put the tree ``new`` at ``final``, where a complete tree already is, never leaving ``final`` without
    one complete tree: exchanged in one rename where the filesystem can; else the old tree is renamed to
    ``aside`` first (a crash between the two renames leaves it there for the caller to put back)."""
    try:
        exchange(new, final)
    except OSError as exc:
        if exc.errno not in NO_EXCHANGE:
            raise
        os.rename(final, aside)
        os.rename(new, final)
        remove_tree(aside)
    else:
        remove_tree(new)  # now the old tree
