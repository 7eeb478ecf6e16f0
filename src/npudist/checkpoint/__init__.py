"""Crash-safe checkpoints: atomic writes, checksums, the last K kept, bad ones skipped on resume."""

from npudist.checkpoint.store import CheckpointError, list_checkpoints, load_latest, save

__all__ = ["CheckpointError", "list_checkpoints", "load_latest", "save"]
