"""Which files a migration reads and may write: Python sources under the paths given, nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_BYTES = 2 << 20
"""Larger files are generated or vendored code, not a training script: skipped with the reason."""


@dataclass(frozen=True)
class Source:
    path: Path
    text: str | None
    skipped: str | None = None
    """Why the file is not analysed (binary, too large, unreadable, a link); None when text is set."""


def _read(path: Path) -> Source:
    if path.is_symlink():
        return Source(path, None, "a symbolic link (migrate reads and writes only the files named)")
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            return Source(path, None, f"{size} bytes, over the {MAX_BYTES}-byte limit for a script")
        raw = path.read_bytes()
    except OSError as exc:
        return Source(path, None, f"cannot read: {exc.strerror or exc}")
    if b"\0" in raw:
        return Source(path, None, "binary (contains NUL bytes)")
    try:
        return Source(path, raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return Source(path, None, f"not UTF-8 text (byte {exc.start})")


def sources(paths: list[Path]) -> Iterator[Source]:
    """Each ``.py`` file under each path (a file given by name is read whatever its suffix)."""
    for root in paths:
        if not root.exists() and not root.is_symlink():
            yield Source(root, None, "no such file or directory")
        elif root.is_dir() and not root.is_symlink():
            for path in sorted(root.rglob("*.py")):
                if not any(part.startswith(".") for part in path.relative_to(root).parts):
                    yield _read(path)
        else:
            yield _read(root)


def write(path: Path, text: str) -> None:
    """Replace ``path`` atomically: a crash leaves the old or the new script, never half of one."""
    tmp = path.with_name(f".{path.name}.npudist-migrate.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
