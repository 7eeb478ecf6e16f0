"""On-disk layout of a checkpoint directory, as pure functions (names, manifests, verification).

    RUN_DIR/step-00000040/state.pt        the state (or DCP shard files for sharded state)
    RUN_DIR/step-00000040/manifest.json   written last: step, format, sha256 and size of every file
    RUN_DIR/.tmp-step-00000040/           a write in progress; never read, removed on the next save

A checkpoint exists only once its directory has been renamed into place, so a crash at any moment
leaves either the complete new checkpoint or none of it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

FORMAT = 1
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


def step_dir_name(step: int) -> str:
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step-{step:08d}"


def tmp_dir_name(step: int) -> str:
    return f".tmp-{step_dir_name(step)}"


def parse_step(name: str) -> int | None:
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def build_manifest(step: int, files: Iterable[Path], root: Path, kind: str, version: str) -> dict:
    return {
        "format": FORMAT,
        "step": step,
        "kind": kind,
        "npudist": version,
        "files": {
            str(f.relative_to(root)): {"sha256": sha256_file(f), "bytes": f.stat().st_size}
            for f in sorted(files)
        },
    }


def verify(directory: Path) -> tuple[dict | None, str | None]:
    """(manifest, None) when every listed file is present with its recorded size and hash, else (None, why)."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return None, "no manifest.json (the write never finished)"
    except (OSError, ValueError) as exc:
        return None, f"manifest.json unreadable: {exc}"
    well_formed = isinstance(manifest, dict) and isinstance(manifest.get("files"), dict)
    if not well_formed or manifest.get("format") != FORMAT:
        return None, "manifest.json is not an npudist checkpoint manifest"
    if manifest.get("step") != parse_step(directory.name):
        return None, f"manifest step {manifest.get('step')!r} does not match the directory name"
    for name, meta in manifest["files"].items():
        f = directory / name
        if not f.is_file():
            return None, f"{name} is missing"
        size = f.stat().st_size
        if size != meta.get("bytes"):
            return None, f"{name} has {size} bytes, the manifest says {meta.get('bytes')} (truncated?)"
        if sha256_file(f) != meta.get("sha256"):
            return None, f"{name} fails its sha256 check (corrupted)"
    return manifest, None
