"""save()/load_latest(): atomic, checksummed checkpoints that keep the last K and skip bad ones."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from npudist._version import __version__
from npudist.checkpoint.layout import (
    MANIFEST,
    build_manifest,
    parse_step,
    step_dir_name,
    tmp_dir_name,
    verify,
)

log = logging.getLogger("npudist.checkpoint")
STATE_FILE = "state.pt"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says what happened and what is intact."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(path)


def list_checkpoints(directory: str | os.PathLike) -> list[int]:
    """Steps of the complete-looking checkpoint directories, newest first (not yet verified)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    steps = [s for p in root.iterdir() if p.is_dir() and (s := parse_step(p.name)) is not None]
    return sorted(steps, reverse=True)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _explain_write_error(exc: OSError, root: Path, step: int) -> CheckpointError:
    kept = list_checkpoints(root)
    intact = f"the previous checkpoint (step {kept[0]}) is untouched" if kept else "no earlier checkpoint exists"
    if exc.errno == errno.ENOSPC:
        what = f"no space left on the device holding {root}"
        fix = "free space there, lower keep=, or point the run directory at a larger disk"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        what = f"permission denied writing to {root}"
        fix = "make the run directory writable by this user, or choose another one"
    else:
        what = f"{exc.strerror or exc} while writing to {root}"
        fix = "check the disk and the run directory"
    return CheckpointError(f"could not save checkpoint step {step}: {what}; {intact}. Fix: {fix}.")


def save(state: dict[str, Any], directory: str | os.PathLike, step: int, *, keep: int = 3,
         sharded: bool = False) -> Path | None:
    """Write ``state`` as checkpoint ``step``; return its directory on the writing rank.

    Plain (DDP) state: rank 0 writes, the others wait at a barrier. ``sharded=True`` uses
    torch.distributed.checkpoint so every rank writes its shards (FSDP, tensor parallel). Either way
    the new directory appears whole or not at all, and only then are checkpoints beyond ``keep`` removed.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(directory)
    rank = dist.get_rank() if _distributed() else 0
    final, tmp = root / step_dir_name(step), root / tmp_dir_name(step)
    error: CheckpointError | None = None
    if rank == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # a write that died earlier
            tmp.mkdir()
        except OSError as exc:
            error = _explain_write_error(exc, root, step)
    if sharded and _distributed():
        _raise_if_any(error)
        try:
            import torch.distributed.checkpoint as dcp

            dcp.save(state, checkpoint_id=str(tmp))
        except OSError as exc:
            error = _explain_write_error(exc, root, step)
        _raise_if_any(error)
    elif rank == 0 and error is None:
        try:
            with open(tmp / STATE_FILE, "wb") as f:
                torch.save(state, f)
        except OSError as exc:
            error = _explain_write_error(exc, root, step)
    if rank == 0 and error is None:
        try:
            manifest = build_manifest(step, [p for p in tmp.rglob("*") if p.is_file()], tmp,
                                      "sharded" if sharded else "plain", __version__)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
            _fsync_tree(tmp)
            if final.exists():  # the same step saved again (a resumed run): replace it whole
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(root)
            _prune(root, keep)
        except OSError as exc:
            error = _explain_write_error(exc, root, step)
    if rank == 0 and error is not None:
        shutil.rmtree(tmp, ignore_errors=True)  # leave the directory as it was before this save
    _raise_if_any(error)
    return final if rank == 0 else None


def _raise_if_any(error: CheckpointError | None) -> None:
    """Every rank raises if any rank failed, so no rank trains on believing a checkpoint exists."""
    if _distributed():
        flag = torch.tensor([1 if error else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and error is None:
            raise CheckpointError("checkpoint save failed on another rank (rank 0 logged the reason)")
    if error is not None:
        raise error


def _prune(root: Path, keep: int) -> None:
    for step in list_checkpoints(root)[keep:]:
        shutil.rmtree(root / step_dir_name(step), ignore_errors=True)


def load_latest(directory: str | os.PathLike, *, template: dict[str, Any] | None = None,
                map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], int] | None:
    """The newest checkpoint that verifies, as (state, step); None when there is none.

    Truncated or corrupted checkpoints are skipped with a warning naming what was wrong, falling back
    to the previous good one. Sharded checkpoints load in place into ``template`` (DCP's contract).
    """
    root = Path(directory)
    for step in list_checkpoints(root):
        path = root / step_dir_name(step)
        manifest, why = verify(path)
        if manifest is None:
            log.warning("skipping checkpoint %s: %s; falling back to the previous one", path, why)
            continue
        try:
            if manifest["kind"] == "sharded":
                if template is None:
                    raise CheckpointError(f"{path} is sharded: pass template= (the state dict to load into)")
                import torch.distributed.checkpoint as dcp

                dcp.load(template, checkpoint_id=str(path))
                return template, step
            # weights_only: loading a checkpoint must never run code from the file.
            return torch.load(path / STATE_FILE, map_location=map_location, weights_only=True), step
        except CheckpointError:
            raise
        except Exception as exc:
            log.warning("skipping checkpoint %s: it verified but did not load (%s: %s)", path,
                        type(exc).__name__, exc)
    return None
