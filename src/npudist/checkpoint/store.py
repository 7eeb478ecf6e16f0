"""save()/load_latest(): atomic, checksummed checkpoints that keep the last K and skip bad ones."""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist

from npudist._version import __version__
from npudist.checkpoint import provenance
from npudist.checkpoint.layout import (
    MANIFEST,
    STATE_FILE,
    aside_dir_name,
    build_manifest,
    open_checkpoint_dir,
    open_inside,
    parse_leftover,
    parse_step,
    step_dir_name,
    tmp_dir_name,
    verify,
)
from npudist.checkpoint.writer import CheckpointError, SaveHandle, writer
from npudist.comm import busy as comm_busy
from npudist.comm import control
from npudist.runtime import compat

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


# errno -> (what happened, how to fix it), for the failures a checkpoint write meets in practice.
_WRITE_ERRORS: Mapping[int, tuple[str, str]] = MappingProxyType({
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


def _os_error_in(exc: BaseException) -> OSError | None:
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


def _explain_write_error(exc: BaseException, root: Path, step: int, path: Path) -> CheckpointError:
    """One message for every rank: what failed (errno name and the file), what is intact, the fix."""
    kept = _good_steps(root)
    intact = f"the previous checkpoint (step {kept[0]}) is untouched" if kept else "no earlier checkpoint exists"
    os_error = _os_error_in(exc)
    if os_error is None:
        what, fix = f"{type(exc).__name__}: {exc}", "check the state passed to save() and the run directory"
    else:
        code = os_error.errno or 0
        what, fix = _WRITE_ERRORS.get(code, (f"{os_error.strerror or os_error} while writing to {{root}}",
                                              "check the disk and the run directory"))
        what = f"{what.format(root=root)} ({errno.errorcode.get(code, f'errno {code}')} writing " \
               f"{os_error.filename or path})"
    return CheckpointError(f"could not save checkpoint step {step}: {what}; {intact}. Fix: {fix}.")


def _good_steps(root: Path) -> list[int]:
    """Steps of the directories that are whole checkpoints (manifest and files of the recorded sizes),
    newest first; a stray step-N directory without them is neither kept, counted, nor removed."""
    return [s for s in list_checkpoints(root) if verify(root / step_dir_name(s), hashes=False)[1] is None]


def _refusal(root: Path, step: int, overwrite: bool) -> CheckpointError | None:
    """Saving below the newest checkpoint is another run's directory: pruning would keep its newer steps
    and resuming would load them. Refused unless the caller says the older run's steps may go."""
    if overwrite:
        return None
    newer = next((s for s in list_checkpoints(root) if s > step and verify(root / step_dir_name(s), hashes=False)[1]
                  is None), None)  # usually none is newer, so nothing is read
    if newer is None:
        return None
    return CheckpointError(
        f"refusing to save checkpoint step {step} in {root}: it already holds step {newer}, a newer one, so it "
        "looks like another run's directory (resuming would load that run's step). Fix: give this run its own "
        "directory, or pass overwrite=True to replace the newer checkpoints with this run's.")


def save(state: dict[str, Any], directory: str | os.PathLike, step: int, *, keep: int = 3,
         sharded: bool = False, async_save: bool = False, overwrite: bool = False) -> Path | SaveHandle | None:
    """Write ``state`` as checkpoint ``step``; return its directory on the writing rank.

    Plain (DDP) state: rank 0 writes; the others wait for it (sync) or go on (async). ``sharded=True`` uses
    torch.distributed.checkpoint so every rank writes its shards (FSDP, tensor parallel). Either way
    the new directory appears whole or not at all, and only then are checkpoints beyond ``keep`` removed
    (the one just written never is). A step lower than the newest checkpoint in ``directory`` is refused
    (CheckpointError on every rank) unless ``overwrite=True``, which removes those newer checkpoints once
    this one is published. A write failure raises the same CheckpointError on every rank and leaves the
    directory as it was.

    ``async_save=True`` returns a SaveHandle once a host copy of ``state`` is taken; writing, fsync,
    checksums and manifest happen in the background. One write is in flight at a time (the next save
    waits for it), and a background failure is raised as CheckpointError by ``handle.wait()``, by the
    next save on the ranks that wrote (rank 0 for plain state; every rank for sharded state) or by
    ``npudist.shutdown()``.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    if sharded:
        compat.require("dcp_async_save" if async_save else "dcp_checkpoint_id",
                       "save(sharded=True, async_save=True)" if async_save else "save(sharded=True)")
    began = time.perf_counter()
    root = Path(directory)
    rank = dist.get_rank() if _distributed() else 0
    final, tmp = root / step_dir_name(step), root / tmp_dir_name(step)
    error = writer().settle()  # at most one save in flight, and its failure is this call's failure
    nonfinite = _nonfinite_refusal(state, step)
    if async_save and not sharded:
        # Plain state is DDP's replica, the same on every rank: each rank finds the same NaN and raises.
        error = error or nonfinite
        # Plain state has one writer, rank 0, so there is nothing to agree on: no collective here,
        # which would make every save wait for the slowest rank. Rank 0 raises its own failures.
        if error is None and rank == 0:
            error = _refusal(root, step, overwrite)
        if error is not None:
            raise error
        handle = _save_async(state, root, tmp, final, step, keep, False, rank, overwrite) if rank == 0 \
            else SaveHandle(step)
        writer().record(snapshot_s=time.perf_counter() - began)
        return handle
    if rank == 0 and error is None and nonfinite is None:
        error = _refusal(root, step, overwrite) or _prepare(root, tmp, step)
    _raise_if_any(error or nonfinite)  # also orders rank 0's fresh tmp directory before any rank's shard writes
    if async_save:
        handle = _save_async(state, root, tmp, final, step, keep, True, rank, overwrite)
        writer().record(snapshot_s=time.perf_counter() - began)
        return handle
    try:
        with comm_busy(f"writing checkpoint {step}"):  # the other ranks' wait below is expected
            if sharded:
                import torch.distributed.checkpoint as dcp

                dcp.save(state, checkpoint_id=str(tmp))
            elif rank == 0:
                _write_state(state, tmp / STATE_FILE)
            if rank == 0:
                time.sleep(float(os.environ.get(SYNC_DELAY_VAR) or 0))
                write_began = time.perf_counter()
                nbytes = _publish(root, tmp, final, step, keep, "sharded" if sharded else "plain", overwrite)
                writer().record(write_s=time.perf_counter() - write_began, nbytes=nbytes)
    except Exception as exc:  # any failure, not only OSError: every rank must reach the check below
        error = _explain_write_error(exc, root, step, tmp if sharded else tmp / STATE_FILE)
        writer().record(failed=True)
    if rank == 0 and error is not None:
        shutil.rmtree(tmp, ignore_errors=True)  # leave the directory as it was before this save
    _raise_if_any(error)
    writer().record(snapshot_s=time.perf_counter() - began)
    return final if rank == 0 else None


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


def _write_state(state: Any, path: Path) -> None:
    with open(path, "wb") as f:
        sink = _WriteSink(f)
        try:
            torch.save(state, sink)
        except RuntimeError as exc:
            if sink.error is not None:
                raise sink.error from exc
            raise


def _prepare(root: Path, tmp: Path, step: int) -> CheckpointError | None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        _clear_leftovers(root)
        tmp.mkdir()
    except OSError as exc:
        return _explain_write_error(exc, root, step, tmp)
    return None


def _clear_leftovers(root: Path) -> None:
    """Remove what saves that died left behind; no write is in flight here (save() settled the last one,
    and the run-dir lock keeps other jobs out). A step's old copy moved aside by a replace that died
    before the new one took its place is put back."""
    for entry in root.iterdir():
        left = parse_leftover(entry.name)
        if left is None or entry.is_symlink() or not entry.is_dir():
            continue
        kind, step = left
        final = root / step_dir_name(step)
        if kind == "old" and not os.path.lexists(final):
            os.rename(entry, final)
        else:
            _remove_tree(entry)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> None:
    """Swap two existing names in one step (renameat2 RENAME_EXCHANGE, Linux >= 3.15, glibc >= 2.28).
    OSError EINVAL/ENOSYS/EOPNOTSUPP where the kernel, libc or filesystem (NFS, for one) lacks it."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not in this C library")
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a), None, str(b))


def _replace(tmp: Path, final: Path, aside: Path) -> None:
    """Put the new ``tmp`` at ``final``, where a complete copy of that step already is, never leaving
    that step without one complete copy: exchanged in one rename where the filesystem can; else the old
    copy is renamed aside first (a crash between the two renames leaves it there, and the next save
    puts it back)."""
    try:
        _exchange(tmp, final)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        os.rename(final, aside)
        os.rename(tmp, final)
        _remove_tree(aside)
    else:
        _remove_tree(tmp)  # now the old copy


def _publish(root: Path, tmp: Path, final: Path, step: int, keep: int, kind: str, overwrite: bool) -> int:
    """Manifest, fsync, rename into place, prune; the checkpoint's bytes. Rank 0, after all files exist."""
    files = [p for p in tmp.rglob("*") if p.is_file()]
    manifest = provenance.stamp(build_manifest(step, files, tmp, kind, __version__), provenance.current_mode())
    text = json.dumps(manifest, indent=1).encode()
    (tmp / MANIFEST).write_bytes(text)
    _fsync_tree(tmp)
    if os.path.lexists(final):  # the same step saved again (a resumed run)
        _replace(tmp, final, root / aside_dir_name(step))
    else:
        os.rename(tmp, final)
    _fsync_dir(root)
    _prune(root, keep, step, overwrite)
    return sum(m["bytes"] for m in manifest["files"].values()) + len(text)


TEST_DELAY_VAR = "NPUDIST_TEST_CHECKPOINT_DELAY_S"
"""Tests only: seconds a background write sleeps between its files and its manifest (a slow disk)."""
SYNC_DELAY_VAR = "NPUDIST_TEST_SYNC_CHECKPOINT_DELAY_S"
"""Tests only: seconds rank 0 sleeps in a synchronous save before publishing, while the other ranks wait for
it in the checkpoint's control collective (a slow disk)."""


def _save_async(state: dict[str, Any], root: Path, tmp: Path, final: Path, step: int, keep: int,
                sharded: bool, rank: int, overwrite: bool) -> SaveHandle:
    """Take the host copy here; everything after it runs in the writer's background thread."""
    kind = "sharded" if sharded else "plain"
    group = None
    if sharded:
        import torch.distributed.checkpoint as dcp

        # DCP stages (copies to host) before returning; its upload runs on its own thread.
        group = control.side_group() if _distributed() else None
        if not compat.has("dcp_async_copies_cpu"):
            state = writer().host_copy(state)  # this torch's async_save would write values changed after it
        future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=group)

        def write_files() -> None:
            future.result()
    else:
        snapshot = writer().host_copy(state)

        def write_files() -> None:
            if error := _prepare(root, tmp, step):
                raise error
            _write_state(snapshot, tmp / STATE_FILE)

    delay = float(os.environ.get(TEST_DELAY_VAR) or 0)

    def work() -> tuple[Path | None, int]:
        published = None
        try:
            write_files()
            if rank == 0:
                time.sleep(delay)
                published = final, _publish(root, tmp, final, step, keep, kind, overwrite)
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
        return _explain_write_error(exc, root, step, tmp if sharded else tmp / STATE_FILE)

    return writer().start(step, work, on_error=on_error)


def _nonfinite_refusal(state: dict[str, Any], step: int) -> CheckpointError | None:
    """With the NaN sentinel on (npudist/sentinel.py): no checkpoint after a non-finite stop, and none of a
    state holding NaN, so the newest checkpoint stays the last finite state (NaN only: a mask buffer may
    hold -inf by design). Costs one pass over the state's tensors, at save time only."""
    from npudist.comm.nonfinite import first_nan
    from npudist.runtime.state import peek

    sentinel = getattr(peek(), "sentinel", None)
    if sentinel is None:
        return None
    if sentinel.stopped is not None:
        return CheckpointError(f"not saving checkpoint {step}: the job stopped on a non-finite value "
                               f"({sentinel.stopped.line()})")
    bad = first_nan(state)
    if bad is None:
        return None
    return CheckpointError(f"not saving checkpoint {step}: {bad} holds NaN, so the newest checkpoint stays the "
                           "last finite state; look for the step where the loss went non-finite (NPUDIST_SENTINEL="
                           "scan names the rank and bucket)")


def _raise_if_any(error: CheckpointError | None) -> None:
    """Every rank raises the first failed rank's error, so no rank trains on believing a checkpoint
    exists, and all of them make the same collectives whether it failed or not."""
    # Numbered: the other ranks wait here while rank 0 writes, and a peer lost meanwhile must be named.
    src = control.first_rank(error is not None, numbered=True)
    if src is not None:  # the failure path only: one more control message carries the reason
        message = control.broadcast_object(str(error) if error is not None else None, src=src, numbered=True)
        if error is None:
            error = CheckpointError(message)
    if error is not None:
        raise error


def _prune(root: Path, keep: int, written: int, overwrite: bool) -> None:
    """Keep ``written`` and the newest ``keep - 1`` other checkpoints. Only whole checkpoints count or
    go; those newer than ``written`` are another run's and go only with overwrite=True."""
    kept = 1
    for step in _good_steps(root):
        if step > written and overwrite:
            _remove_tree(root / step_dir_name(step))
        elif step < written:
            if kept < keep:
                kept += 1
            else:
                _remove_tree(root / step_dir_name(step))


def load_latest(directory: str | os.PathLike, *, template: dict[str, Any] | None = None,
                map_location: str | torch.device = "cpu",
                allow_simulated: bool = False) -> tuple[dict[str, Any], int] | None:
    """The newest checkpoint that verifies, as (state, step); None when there is none.

    Truncated or corrupted checkpoints are skipped with a warning naming what was wrong, falling back
    to the previous good one. Sharded checkpoints load in place into ``template`` (DCP's contract).
    CheckpointError when a real run would resume from a simulated NPU's checkpoint (``allow_simulated``).
    """
    with comm_busy(f"loading a checkpoint from {directory}"):
        return _load_latest(Path(directory), template, map_location, allow_simulated)


def _load_latest(root: Path, template: dict[str, Any] | None, map_location: str | torch.device,
                 allow_simulated: bool) -> tuple[dict[str, Any], int] | None:
    for step in list_checkpoints(root):
        path = root / step_dir_name(step)
        manifest, why = verify(path)
        if manifest is None:
            log.warning("skipping checkpoint %s: %s; falling back to the previous one", path, why)
            continue
        refused = provenance.refusal(manifest, path, provenance.current_mode(), allow_simulated)
        if refused is not None:
            raise CheckpointError(refused)
        try:
            if manifest["kind"] == "sharded":
                if template is None:
                    raise CheckpointError(f"{path} is sharded: pass template= (the state dict to load into)")
                compat.require("dcp_checkpoint_id", "loading a sharded checkpoint")
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
