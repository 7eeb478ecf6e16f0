"""Crash-safe checkpoints: atomic writes, checksums, the last K kept, bad ones skipped on resume,
asynchronous writes, one job per run directory, and a training loop's use of them (LoopCheckpoints)."""

from npudist.checkpoint.lock import RunDirBusy, RunDirLock, RunDirLockError, lock_run_dir
from npudist.checkpoint.loop import LoopCheckpoints, describe_newest, state_sha256
from npudist.checkpoint.peer import PeerSnapshots, Restored, restore
from npudist.checkpoint.store import CheckpointError, list_checkpoints, load_latest, save
from npudist.checkpoint.writer import CheckpointStats, SaveHandle, writer


def peer_snapshots(rank: int, world_size: int, local_world_size: int) -> PeerSnapshots | None:
    """This rank's in-memory peer snapshots when `npudist launch --peer-snapshots K` turned them on, else
    None. Every rank must call it (ranks swap their nodes' holder addresses)."""
    from npudist.checkpoint.peer import from_env

    return from_env(rank, world_size, local_world_size)


def stats() -> CheckpointStats:
    """This process's checkpoint figures (the exporter's npudist_checkpoint_* metrics)."""
    return writer().stats()


__all__ = [
    "CheckpointError",
    "CheckpointStats",
    "LoopCheckpoints",
    "PeerSnapshots",
    "Restored",
    "RunDirBusy",
    "RunDirLock",
    "RunDirLockError",
    "SaveHandle",
    "describe_newest",
    "list_checkpoints",
    "load_latest",
    "lock_run_dir",
    "peer_snapshots",
    "restore",
    "save",
    "state_sha256",
    "stats",
]
