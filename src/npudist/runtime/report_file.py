"""Writing a diagnosis file into a run directory that other users or jobs may also write to.

The file appears whole or not at all, and nothing planted in the directory can redirect the write: the
text goes to a new file created exclusively (O_EXCL, O_NOFOLLOW, an unpredictable name) beside the target,
which is then renamed over it. rename(2) replaces a symlink at the target itself, never what it points to.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_report(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` (its directory is created); OSError names what failed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, _CREATE, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target
