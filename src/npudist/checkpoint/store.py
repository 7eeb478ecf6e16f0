"""save()/load_latest(): atomic, checksummed checkpoints that keep the last K and skip bad ones."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from npudist._version import __version__
from npudist.checkpoint.layout import (
    MANIFEST,
    STATE_FILE,
    build_manifest,
    open_checkpoint_dir,
    open_inside,
    parse_step,
    step_dir_name,
    tmp_dir_name,
    verify,
)
from npudist.checkpoint.writer import CheckpointError, SaveHandle, writer
from npudist.comm import control

log = logging.getLogger("npudist.checkpoint")


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
    steps = [s for p in root.iterdir() if (s := parse_step(p.name)) is not None and p.is_dir() and not p.is_symlink()]
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
         sharded: bool = False, async_save: bool = False) -> Path | SaveHandle | None:
    """Write ``state`` as checkpoint ``step``; return its directory on the writing rank.

    Plain (DDP) state: rank 0 writes; the others wait for it (sync) or go on (async). ``sharded=True`` uses
    torch.distributed.checkpoint so every rank writes its shards (FSDP, tensor parallel). Either way
    the new directory appears whole or not at all, and only then are checkpoints beyond ``keep`` removed.

    ``async_save=True`` returns a SaveHandle once a host copy of ``state`` is taken; writing, fsync,
    checksums and manifest happen in the background. One write is in flight at a time (the next save
    waits for it), and a background failure is raised as CheckpointError by ``handle.wait()``, by the
    next save on the ranks that wrote (rank 0 for plain state; every rank for sharded state) or by
    ``npudist.shutdown()``.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    began = time.perf_counter()
    root = Path(directory)
    rank = dist.get_rank() if _distributed() else 0
    final, tmp = root / step_dir_name(step), root / tmp_dir_name(step)
    error = writer().settle()  # at most one save in flight, and its failure is this call's failure
    if async_save and not sharded:
        # Plain state has one writer, rank 0, so there is nothing to agree on: no collective here,
        # which would make every save wait for the slowest rank. Rank 0 raises its own failures.
        if error is not None:
            raise error
        handle = _save_async(state, root, tmp, final, step, keep, False, rank) if rank == 0 else SaveHandle(step)
        writer().record(snapshot_s=time.perf_counter() - began)
        return handle
    if rank == 0 and error is None:
        error = _prepare(root, tmp, step)
    _raise_if_any(error)  # also orders rank 0's fresh tmp directory before any rank's shard writes
    if async_save:
        handle = _save_async(state, root, tmp, final, step, keep, True, rank)
        writer().record(snapshot_s=time.perf_counter() - began)
        return handle
    try:
        if sharded:
            import torch.distributed.checkpoint as dcp

            dcp.save(state, checkpoint_id=str(tmp))
        elif rank == 0:
            with open(tmp / STATE_FILE, "wb") as f:
                torch.save(state, f)
        if rank == 0:
            write_began = time.perf_counter()
            nbytes = _publish(root, tmp, final, step, keep, "sharded" if sharded else "plain")
            writer().record(write_s=time.perf_counter() - write_began, nbytes=nbytes)
    except OSError as exc:
        error = _explain_write_error(exc, root, step)
        writer().record(failed=True)
    if rank == 0 and error is not None:
        shutil.rmtree(tmp, ignore_errors=True)  # leave the directory as it was before this save
    _raise_if_any(error)
    writer().record(snapshot_s=time.perf_counter() - began)
    return final if rank == 0 else None


def _prepare(root: Path, tmp: Path, step: int) -> CheckpointError | None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a write that died earlier
        tmp.mkdir()
    except OSError as exc:
        return _explain_write_error(exc, root, step)
    return None


def _publish(root: Path, tmp: Path, final: Path, step: int, keep: int, kind: str) -> int:
    """Manifest, fsync, rename into place, prune; the checkpoint's bytes. Rank 0, after all files exist."""
    files = [p for p in tmp.rglob("*") if p.is_file()]
    manifest = build_manifest(step, files, tmp, kind, __version__)
    text = json.dumps(manifest, indent=1).encode()
    (tmp / MANIFEST).write_bytes(text)
    _fsync_tree(tmp)
    if final.exists():  # the same step saved again (a resumed run): replace it whole
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    _prune(root, keep)
    return sum(m["bytes"] for m in manifest["files"].values()) + len(text)


TEST_DELAY_VAR = "NPUDIST_TEST_CHECKPOINT_DELAY_S"
"""Tests only: seconds a background write sleeps between its files and its manifest (a slow disk)."""


def _save_async(state: dict[str, Any], root: Path, tmp: Path, final: Path, step: int, keep: int,
                sharded: bool, rank: int) -> SaveHandle:
    """Take the host copy here; everything after it runs in the writer's background thread."""
    kind = "sharded" if sharded else "plain"
    group = None
    if sharded:
        import torch.distributed.checkpoint as dcp

        # DCP stages (copies to host) before returning; its upload runs on its own thread.
        group = control.side_group() if _distributed() else None
        future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=group)

        def write_files() -> None:
            future.result()
    else:
        snapshot = writer().host_copy(state)

        def write_files() -> None:
            if error := _prepare(root, tmp, step):
                raise error
            with open(tmp / STATE_FILE, "wb") as f:
                torch.save(snapshot, f)

    delay = float(os.environ.get(TEST_DELAY_VAR) or 0)

    def work() -> tuple[Path | None, int]:
        published = None
        try:
            write_files()
            if rank == 0:
                time.sleep(delay)
                published = final, _publish(root, tmp, final, step, keep, kind)
        finally:
            # every rank's wait() returns once rank 0 published (or failed)
            ok = group is None or control.from_rank(published is not None, src=0, group=group)
            if not ok and rank != 0:
                raise CheckpointError(f"checkpoint step {step} was not published: rank 0 failed "
                                      "(its log says why)")
        return published or (None, 0)

    def on_error(exc: Exception) -> CheckpointError:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, CheckpointError):
            return exc
        if isinstance(exc, OSError):
            return _explain_write_error(exc, root, step)
        return CheckpointError(f"could not save checkpoint step {step}: {type(exc).__name__}: {exc}")

    return writer().start(step, work, on_error=on_error)


def _raise_if_any(error: CheckpointError | None) -> None:
    """Every rank raises if any rank failed, so no rank trains on believing a checkpoint exists."""
    if control.any_rank(error is not None) and error is None:
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
            # weights_only: loading a checkpoint must never run code from the file. The file is opened
            # as verify() opened it: inside the directory, no symlink followed.
            return _load_plain(path, map_location), step
        except CheckpointError:
            raise
        except Exception as exc:
            log.warning("skipping checkpoint %s: it verified but did not load (%s: %s)", path,
                        type(exc).__name__, exc)
    return None


def _load_plain(path: Path, map_location: str | torch.device) -> dict[str, Any]:
    dir_fd = open_checkpoint_dir(path)
    try:
        fd = open_inside(dir_fd, STATE_FILE)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as f:
        return torch.load(f, map_location=map_location, weights_only=True)
