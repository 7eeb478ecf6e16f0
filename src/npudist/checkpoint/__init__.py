"""Crash-safe checkpoints: atomic writes, checksums, the last K kept, bad ones skipped on resume,
asynchronous writes, and one job per run directory."""

from npudist.checkpoint.lock import RunDirBusy, RunDirLock, RunDirLockError, lock_run_dir
from npudist.checkpoint.store import CheckpointError, list_checkpoints, load_latest, save
from npudist.checkpoint.writer import CheckpointStats, SaveHandle, writer


def stats() -> CheckpointStats:
    """This process's checkpoint figures (the exporter's npudist_checkpoint_* metrics)."""
    return writer().stats()


__all__ = ["CheckpointError", "CheckpointStats", "RunDirBusy", "RunDirLock", "RunDirLockError", "SaveHandle",
           "list_checkpoints", "load_latest", "lock_run_dir", "save", "stats"]
