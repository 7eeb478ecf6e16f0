"""Writing a generator's (relative path -> text) files under a folder."""

from __future__ import annotations

import os
from pathlib import Path


def write_files(out_dir: str | os.PathLike[str], files: dict[str, str],
                executable: frozenset[str] = frozenset()) -> list[Path]:
    """Write every file (folders created, existing files replaced); ``executable`` paths get mode 0755."""
    written = []
    for rel, text in files.items():
        path = Path(out_dir) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if rel in executable:
            path.chmod(0o755)
        written.append(path)
    return written
