"""save(): the checkpoint policy across ranks, plain or sharded, synchronous or in the background.

A save writes into a hidden temporary directory, then rank 0 publishes it: manifest, fsync, one rename
into place (atomic.py), and pruning to the newest ``keep``. Every rank agrees on the outcome through
comm.control, so all of them raise the same CheckpointError (errors.py) or none does. Reading is load.py.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from npudist._version import __version__
from npudist.checkpoint import atomic, provenance
from npudist.checkpoint.errors import explain_write_error, write_state
from npudist.checkpoint.layout import (
    MANIFEST,
    STATE_FILE,
    aside_dir_name,
    build_manifest,
    parse_leftover,
    step_dir_name,
    tmp_dir_name,
    verify,
)
from npudist.checkpoint.load import list_checkpoints, load_latest, whole_steps
from npudist.checkpoint.writer import SYNC_DELAY_VAR, TEST_DELAY_VAR, CheckpointError, SaveHandle, writer
from npudist.comm import busy as comm_busy
from npudist.comm import control
from npudist.runtime import compat

__all__ = ["SYNC_DELAY_VAR", "TEST_DELAY_VAR", "CheckpointError", "list_checkpoints", "load_latest", "save"]


@dataclass(frozen=True)
class _Target:
    """One save: where it goes and the rules it keeps, the same on every rank."""

    root: Path
    step: int
    keep: int
    overwrite: bool
    sharded: bool
    rank: int

    @property
    def final(self) -> Path:
        return self.root / step_dir_name(self.step)

    @property
    def tmp(self) -> Path:
        return self.root / tmp_dir_name(self.step)

    @property
    def kind(self) -> str:
        return "sharded" if self.sharded else "plain"

    @property
    def written(self) -> Path:
        """What a write failure names: DCP's directory, or the one state file."""
        return self.tmp if self.sharded else self.tmp / STATE_FILE

    def explain(self, exc: BaseException) -> CheckpointError:
        return explain_write_error(exc, root=self.root, step=self.step, path=self.written,
                                   kept=whole_steps(self.root))


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _refusal(target: _Target) -> CheckpointError | None:
    """Saving below the newest checkpoint is another run's directory: pruning would keep its newer steps
    and resuming would load them. Refused unless the caller says the older run's steps may go."""
    if target.overwrite:
        return None
    root, step = target.root, target.step
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
    target = _Target(root=Path(directory), step=step, keep=keep, overwrite=overwrite, sharded=sharded,
                     rank=dist.get_rank() if _distributed() else 0)
    error = writer().settle()  # at most one save in flight, and its failure is this call's failure
    nonfinite = _nonfinite_refusal(state, step)
    if async_save and not sharded:
        handle = _save_plain_async(state, target, error or nonfinite)
    elif async_save:
        _agree(target, error, nonfinite)
        handle = _save_async(state, target)
    else:
        _agree(target, error, nonfinite)
        _save_sync(state, target)
        handle = None
    writer().record(snapshot_s=time.perf_counter() - began)
    if handle is not None:
        return handle
    return target.final if target.rank == 0 else None


def _agree(target: _Target, error: CheckpointError | None, nonfinite: CheckpointError | None) -> None:
    """Every rank raises the same refusal, or rank 0 prepares the temporary directory; the collective
    inside also orders that directory before any rank's shard writes."""
    if target.rank == 0 and error is None and nonfinite is None:
        error = _refusal(target) or _prepare(target)
    _raise_if_any(error or nonfinite)


def _save_plain_async(state: dict[str, Any], target: _Target, error: CheckpointError | None) -> SaveHandle:
    # Plain state is DDP's replica, the same on every rank: each rank finds the same NaN and raises. It has
    # one writer, rank 0, so there is nothing to agree on: no collective here, which would make every save
    # wait for the slowest rank. Rank 0 raises its own failures.
    if error is None and target.rank == 0:
        error = _refusal(target)
    if error is not None:
        raise error
    return _save_async(state, target) if target.rank == 0 else SaveHandle(target.step)


def _save_sync(state: dict[str, Any], target: _Target) -> None:
    error = None
    try:
        with comm_busy(f"writing checkpoint {target.step}"):  # the other ranks' wait below is expected
            if target.sharded:
                import torch.distributed.checkpoint as dcp

                dcp.save(state, checkpoint_id=str(target.tmp))
            elif target.rank == 0:
                write_state(state, target.tmp / STATE_FILE)
            if target.rank == 0:
                time.sleep(writer().slow_disk.sync_s)
                write_began = time.perf_counter()
                nbytes = _publish(target)
                writer().record(write_s=time.perf_counter() - write_began, nbytes=nbytes)
    except Exception as exc:  # any failure, not only OSError: every rank must reach the check below
        error = target.explain(exc)
        writer().record(failed=True)
    if target.rank == 0 and error is not None:
        shutil.rmtree(target.tmp, ignore_errors=True)  # leave the directory as it was before this save
    _raise_if_any(error)


def _prepare(target: _Target) -> CheckpointError | None:
    try:
        target.root.mkdir(parents=True, exist_ok=True)
        _clear_leftovers(target.root)
        target.tmp.mkdir()
    except OSError as exc:
        return explain_write_error(exc, root=target.root, step=target.step, path=target.tmp,
                                   kept=whole_steps(target.root))
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
            atomic.remove_tree(entry)


def _publish(target: _Target) -> int:
    """Manifest, fsync, rename into place, prune; the checkpoint's bytes. Rank 0, after all files exist."""
    root, tmp, final, step = target.root, target.tmp, target.final, target.step
    files = [p for p in tmp.rglob("*") if p.is_file()]
    manifest = provenance.stamp(build_manifest(step, files, tmp, target.kind, __version__),
                                provenance.current_mode())
    text = json.dumps(manifest, indent=1).encode()
    (tmp / MANIFEST).write_bytes(text)
    atomic.fsync_tree(tmp)
    if os.path.lexists(final):  # the same step saved again (a resumed run)
        atomic.replace(tmp, final, root / aside_dir_name(step))
    else:
        os.rename(tmp, final)
    atomic.fsync_dir(root)
    _prune(target)
    return sum(m["bytes"] for m in manifest["files"].values()) + len(text)


def _save_async(state: dict[str, Any], target: _Target) -> SaveHandle:
    """Take the host copy here; everything after it runs in the writer's background thread."""
    group = None
    if target.sharded:
        import torch.distributed.checkpoint as dcp

        # DCP stages (copies to host) before returning; its upload runs on its own thread.
        group = control.side_group() if _distributed() else None
        if not compat.has("dcp_async_copies_cpu"):
            state = writer().host_copy(state)  # this torch's async_save would write values changed after it
        future = dcp.async_save(state, checkpoint_id=str(target.tmp), process_group=group)

        def write_files() -> None:
            future.result()
    else:
        snapshot = writer().host_copy(state)

        def write_files() -> None:
            if error := _prepare(target):
                raise error
            write_state(snapshot, target.tmp / STATE_FILE)

    delay = writer().slow_disk.background_s

    def work() -> tuple[Path | None, int]:
        published = None
        try:
            write_files()
            if target.rank == 0:
                time.sleep(delay)
                published = target.final, _publish(target)
        finally:
            # every rank's wait() returns once rank 0 published (or failed)
            ok = group is None or control.from_rank(published is not None, src=0, group=group)
            if not ok and target.rank != 0:
                raise CheckpointError(f"checkpoint step {target.step} was not published: rank 0 failed "
                                      "(its log says why)")
        return published or (None, 0)

    def on_error(exc: Exception) -> CheckpointError:
        if target.rank == 0:
            shutil.rmtree(target.tmp, ignore_errors=True)
        return exc if isinstance(exc, CheckpointError) else target.explain(exc)

    return writer().start(target.step, work, on_error=on_error)


def _nonfinite_refusal(state: dict[str, Any], step: int) -> CheckpointError | None:
    """With the NaN sentinel on (npudist/training/sentinel.py): no checkpoint after a non-finite stop, and none of a
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


def _prune(target: _Target) -> None:
    """Keep the step just written and the newest ``keep - 1`` other checkpoints. Only whole checkpoints
    count or go; those newer than it are another run's and go only with overwrite=True."""
    kept = 1
    for step in whole_steps(target.root):
        if step > target.step and target.overwrite:
            atomic.remove_tree(target.root / step_dir_name(step))
        elif step < target.step:
            if kept < target.keep:
                kept += 1
            else:
                atomic.remove_tree(target.root / step_dir_name(step))
