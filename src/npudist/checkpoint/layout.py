"""On-disk layout of a checkpoint directory, as pure functions (names, manifests, verification).

    RUN_DIR/step-00000040/state.pt        the state (or DCP shard files for sharded state)
    RUN_DIR/step-00000040/manifest.json   written last: step, format, sha256 and size of every file
    RUN_DIR/.tmp-step-00000040/           a write in progress; never read, removed on the next save
    RUN_DIR/.old-step-00000040/           a step being replaced by a new save of that step (only where the
                                          filesystem cannot exchange two names); put back or removed on
                                          the next save

A checkpoint exists only once its directory has been renamed into place, so a crash at any moment
leaves either the complete new checkpoint or none of it; a step saved again is exchanged with its old
directory in one rename, so that step always has one complete copy.

A manifest is untrusted input (anyone who can write the run directory can write one): it may name
only regular files inside its own checkpoint directory, reached without following a symlink, and
any manifest that breaks a rule makes the checkpoint "not good", never an exception.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from types import MappingProxyType
from typing import Any

FORMAT = 1
MANIFEST = "manifest.json"
STATE_FILE = "state.pt"
REQUIRED_FILE = MappingProxyType({"plain": STATE_FILE, "sharded": ".metadata"})
"""Per kind, the file a loader reads first; a manifest that does not list it is not a checkpoint."""
MAX_MANIFEST_BYTES = 16 << 20
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_BAD_NAME_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")
# Read-only, no controlling tty, and never block: opening a FIFO for reading waits for a writer.
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def step_dir_name(step: int) -> str:
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step-{step:08d}"


def tmp_dir_name(step: int) -> str:
    return f".tmp-{step_dir_name(step)}"


def aside_dir_name(step: int) -> str:
    return f".old-{step_dir_name(step)}"


def parse_step(name: str) -> int | None:
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def parse_leftover(name: str) -> tuple[str, int] | None:
    """("tmp" | "old", step) for the hidden directories a save that died leaves behind, else None."""
    for kind in ("tmp", "old"):
        if name.startswith(f".{kind}-") and (step := parse_step(name[len(kind) + 2:])) is not None:
            return kind, step
    return None


def _sha256_fd(fd: int, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    while block := os.read(fd, chunk):
        h.update(block)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _sha256_fd(fd)
    finally:
        os.close(fd)


def build_manifest(step: int, files: Iterable[Path], root: Path, kind: str, version: str) -> dict:
    return {
        "format": FORMAT,
        "step": step,
        "kind": kind,
        "npudist": version,
        "files": {
            f.relative_to(root).as_posix(): {"sha256": sha256_file(f), "bytes": f.stat().st_size}
            for f in sorted(files)
        },
    }


def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is an int subclass: `true` must not pass for 1


def name_problem(name: Any) -> str | None:
    """Why ``name`` is not a safe relative path inside a checkpoint directory, or None."""
    if not isinstance(name, str) or not name:
        return f"file name {name!r} is not a non-empty string"
    if len(name) > 4096 or _BAD_NAME_CHARS.search(name):
        return f"file name {name[:80]!r} is too long or has control characters or backslashes"
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return f"file name {name[:80]!r} is not a plain relative path inside the checkpoint (absolute, '..' or '.')"
    if name == MANIFEST:
        return "the manifest lists itself"
    return None


def check_manifest(manifest: Any, step: int | None) -> str | None:
    """Why a decoded manifest is not a well-formed manifest for checkpoint ``step``, or None (pure)."""
    if not isinstance(manifest, dict) or not _is_int(manifest.get("format")) or manifest["format"] != FORMAT:
        return "manifest.json is not an npudist checkpoint manifest (format 1)"
    if not _is_int(manifest.get("step")) or manifest["step"] != step:
        return f"manifest step {str(manifest.get('step'))[:40]!r} does not match the directory name"
    kind = manifest.get("kind")
    if kind not in REQUIRED_FILE:
        return f"manifest kind {str(kind)[:40]!r} is not one of {sorted(REQUIRED_FILE)}"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "manifest 'files' is not an object"
    if REQUIRED_FILE[kind] not in files:
        return f"manifest does not list {REQUIRED_FILE[kind]}, which a {kind} checkpoint needs"
    for name, meta in files.items():
        if why := name_problem(name):
            return why
        if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str) or \
                not _SHA256.match(meta["sha256"]) or not _is_int(meta.get("bytes")) or meta["bytes"] < 0:
            return f"manifest entry for {name} needs a sha256 hex digest and a byte count"
    return None


def open_inside(dir_fd: int, name: str) -> int:
    """A read-only fd for the regular file ``name`` below ``dir_fd``, following no symlink on the way.

    Each component is opened relative to the previous one with O_NOFOLLOW, so neither a symlinked
    file nor a symlinked subdirectory can lead outside; device files, FIFOs and sockets are refused
    after an open that cannot block. Raises OSError (ELOOP, ENOTDIR, ...) or ValueError.
    """
    if why := name_problem(name):
        raise ValueError(why)
    *dirs, leaf = name.split("/")
    fd = os.dup(dir_fd)
    try:
        for part in dirs:
            nxt = os.open(part, _OPEN_DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        file_fd = os.open(leaf, _OPEN_FILE, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise ValueError(f"{name} is not a regular file")
    return file_fd


def open_checkpoint_dir(directory: Path) -> int:
    """An fd for a checkpoint directory that is itself no symlink (so it cannot point elsewhere)."""
    return os.open(directory, _OPEN_DIR)


def read_manifest(dir_fd: int) -> Any:
    """The decoded manifest; OSError/ValueError/RecursionError for anything that is not one."""
    fd = os.open(MANIFEST, _OPEN_FILE, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("manifest.json is not a regular file")
        if st.st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"manifest.json has {st.st_size} bytes, more than {MAX_MANIFEST_BYTES}")
        data = os.read(fd, MAX_MANIFEST_BYTES + 1)
    finally:
        os.close(fd)
    return json.loads(data)


def verify(directory: Path, *, hashes: bool = True) -> tuple[dict | None, str | None]:
    """(manifest, None) when every listed file is present with its recorded size and hash, else (None, why).

    Never raises for anything found on disk: a hostile or damaged checkpoint is only "not good".
    ``hashes=False`` checks everything but the hashes: what a save uses to tell checkpoints from other
    directories before it prunes, where reading every kept checkpoint back would cost keep x its size.
    """
    try:
        dir_fd = open_checkpoint_dir(directory)
    except OSError as exc:
        return None, f"not a real directory ({exc.strerror or exc})"
    try:
        return _verify_open(dir_fd, parse_step(directory.name), hashes)
    finally:
        os.close(dir_fd)


def _verify_open(dir_fd: int, step: int | None, hashes: bool = True) -> tuple[dict | None, str | None]:
    try:
        manifest = read_manifest(dir_fd)
    except FileNotFoundError:
        return None, "no manifest.json (the write never finished)"
    except (OSError, ValueError, RecursionError) as exc:
        text = str(exc) if not isinstance(exc, RecursionError) else "nested too deeply"
        return None, f"manifest.json unreadable: {text[:200]}"
    if why := check_manifest(manifest, step):
        return None, why
    for name, meta in manifest["files"].items():
        try:
            fd = open_inside(dir_fd, name)
        except FileNotFoundError:
            return None, f"{name} is missing"
        except (OSError, ValueError) as exc:
            return None, f"{name} is not a regular file inside the checkpoint ({getattr(exc, 'strerror', None) or exc})"
        try:
            size = os.fstat(fd).st_size
            if size != meta["bytes"]:
                return None, f"{name} has {size} bytes, the manifest says {meta['bytes']} (truncated?)"
            if hashes and _sha256_fd(fd) != meta["sha256"]:
                return None, f"{name} fails its sha256 check (corrupted)"
        except OSError as exc:
            return None, f"{name} unreadable: {exc}"
        finally:
            os.close(fd)
    return manifest, None
