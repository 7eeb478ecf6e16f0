"""Which files a migration reads and may write: Python sources under the paths given, nothing else.

Reading never blocks or follows a link (a FIFO named ``*.py`` is skipped, not opened); directories that
hold installed packages (a virtual environment, a site-packages) are skipped unless asked, recognised by
what they contain rather than by their name. Writing replaces a file atomically: a temporary file created
exclusively beside it, with its mode and owner, flushed to disk, then renamed over it.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tempfile
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_BYTES = 2 << 20
"""Larger files are generated or vendored code, not a training script: skipped with the reason."""
MAX_NESTING = 100
"""Brackets nested deeper than this are refused before libcst parses (its native parser overflows the stack
near 3,000); CPython itself refuses 200 ("too many nested parentheses")."""


@dataclass(frozen=True)
class Source:
    path: Path
    text: str | None
    skipped: str | None = None
    """Why the file is not analysed (binary, too large, unreadable, a link); None when text is set."""


def installed_packages(directory: Path) -> str | None:
    """Why ``directory`` holds installed code (a venv's ``pyvenv.cfg``, conda's ``conda-meta``, or the
    ``*.dist-info`` folders pip writes into site-packages), or None."""
    if (directory / "pyvenv.cfg").is_file():
        return "a virtual environment (pyvenv.cfg)"
    if (directory / "conda-meta").is_dir():
        return "a conda environment (conda-meta)"
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.endswith((".dist-info", ".egg-info")) and entry.is_dir(follow_symlinks=False):
                    return f"installed packages ({entry.name})"
    except OSError:
        return None
    return None


def nesting(text: str) -> int:
    """The deepest bracket nesting of ``text`` (0 where it does not tokenize: libcst reports that)."""
    depth = deepest = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
                deepest = max(deepest, depth)
                if deepest > MAX_NESTING:
                    return deepest
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
    except (tokenize.TokenError, SyntaxError):
        return deepest
    return deepest


def _read(path: Path) -> Source:
    try:
        st = path.lstat()
    except OSError as exc:
        return Source(path, None, f"cannot read: {exc.strerror or exc}")
    if stat.S_ISLNK(st.st_mode):
        return Source(path, None, "a symbolic link (migrate reads and writes only the files named)")
    if not stat.S_ISREG(st.st_mode):
        return Source(path, None, "not a regular file (a FIFO, device or socket is never opened)")
    if st.st_size > MAX_BYTES:
        return Source(path, None, f"{st.st_size} bytes, over the {MAX_BYTES}-byte limit for a script")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return Source(path, None, "not a regular file (replaced while being read)")
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        return Source(path, None, f"cannot read: {exc.strerror or exc}")
    if b"\0" in raw:
        return Source(path, None, "binary (contains NUL bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Source(path, None, f"not UTF-8 text (byte {exc.start})")
    depth = nesting(text)
    if depth > MAX_NESTING:
        return Source(path, None, f"brackets nested more than {MAX_NESTING} deep: not analysed (generated code?)")
    return Source(path, text)


def sources(paths: list[Path], *, include_installed: bool = False) -> Iterator[Source]:
    """Each ``.py`` file under each path (a file given by name is read whatever its suffix). Hidden
    directories, links and installed-package directories are not entered (the last unless
    ``include_installed``); a skipped directory given by name is reported."""
    for root in paths:
        if not root.exists() and not root.is_symlink():
            yield Source(root, None, "no such file or directory")
        elif root.is_dir() and not root.is_symlink():
            why = None if include_installed else installed_packages(root)
            if why:
                yield Source(root, None, f"{why}; pass --include-installed to migrate it")
                continue
            for top, dirs, files in os.walk(root, followlinks=False):
                here = Path(top)
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and
                                 (include_installed or installed_packages(here / d) is None))
                for name in sorted(files):
                    if name.endswith(".py") and not name.startswith("."):
                        yield _read(here / name)
        else:
            yield _read(root)


def write(path: Path, text: str) -> None:
    """Replace ``path`` atomically, keeping its mode and owner: a crash leaves the old or the new script.

    The temporary file is created with O_EXCL under an unpredictable name (mkstemp) beside the target, so
    a link planted there is never followed; the target must still be the regular file that was read.
    """
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path}: no longer a regular file; not written")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".npudist-migrate", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))
            # another user's file in a directory we may write: the mode is kept, the owner becomes us
            with contextlib.suppress(PermissionError):
                os.fchown(f.fileno(), st.st_uid, st.st_gid)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
