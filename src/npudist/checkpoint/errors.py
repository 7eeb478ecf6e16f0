"""What a failed checkpoint write says: the errno behind it (torch.save hides it), what happened, what is
intact and the fix, in one message every rank raises as CheckpointError."""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from npudist.checkpoint.writer import CheckpointError

# errno -> (what happened, how to fix it), for the failures a checkpoint write meets in practice.
WRITE_ERRORS: Mapping[int, tuple[str, str]] = MappingProxyType({
    errno.ENOSPC: ("no space left on the device holding {root}",
                   "free space there, lower keep=, or point the run directory at a larger disk"),
    errno.EDQUOT: ("disk quota exceeded on {root}", "free space in your quota, lower keep=, or use another disk"),
    errno.EFBIG: ("a file grew past this process's file size limit (ulimit -f) or the filesystem's",
                  "raise the limit (ulimit -f unlimited) or write to a filesystem that takes larger files"),
    errno.EACCES: ("permission denied writing to {root}",
                   "make the run directory writable by this user, or choose another one"),
    errno.EPERM: ("permission denied writing to {root}",
                  "make the run directory writable by this user, or choose another one"),
    errno.EROFS: ("{root} is on a read-only filesystem", "choose a run directory on a writable filesystem"),
})


def os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: torch.save reports a failed write as RuntimeError ('unexpected pos')
    raised while handling the OSError of the file's write()."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def explain_write_error(exc: BaseException, *, root: Path, step: int, path: Path,
                        kept: Sequence[int]) -> CheckpointError:
    """One message for every rank: what failed (errno name and the file), what is intact (``kept``: the
    whole checkpoints' steps, newest first), the fix."""
    intact = f"the previous checkpoint (step {kept[0]}) is untouched" if kept else "no earlier checkpoint exists"
    os_error = os_error_in(exc)
    if os_error is None:
        what, fix = f"{type(exc).__name__}: {exc}", "check the state passed to save() and the run directory"
    else:
        code = os_error.errno or 0
        what, fix = WRITE_ERRORS.get(code, (f"{os_error.strerror or os_error} while writing to {{root}}",
                                             "check the disk and the run directory"))
        what = f"{what.format(root=root)} ({errno.errorcode.get(code, f'errno {code}')} writing " \
               f"{os_error.filename or path})"
    return CheckpointError(f"could not save checkpoint step {step}: {what}; {intact}. Fix: {fix}.")


class _WriteSink:
    """The file torch.save writes to, keeping the OSError of a failed write: torch turns it into a
    RuntimeError whose text ('unexpected pos') has lost the errno."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._f.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self._f.flush()


def write_state(state: Any, path: Path) -> None:
    """torch.save to ``path``; a failed write raises its OSError (with the errno), not torch's text."""
    with open(path, "wb") as f:
        sink = _WriteSink(f)
        try:
            torch.save(state, sink)
        except RuntimeError as exc:
            if sink.error is not None:
                raise sink.error from exc
            raise
