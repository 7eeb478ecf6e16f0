"""Reading a run directory: which checkpoints it holds, which are whole, and the newest one that verifies."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from npudist.checkpoint import provenance
from npudist.checkpoint.layout import STATE_FILE, open_checkpoint_dir, open_inside, parse_step, step_dir_name, verify
from npudist.checkpoint.writer import CheckpointError
from npudist.comm import busy as comm_busy
from npudist.runtime import compat

log = logging.getLogger("npudist.checkpoint")


def list_checkpoints(directory: str | os.PathLike) -> list[int]:
    """Steps of the complete-looking checkpoint directories, newest first (not yet verified)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    steps = [s for p in root.iterdir() if (s := parse_step(p.name)) is not None and p.is_dir() and not p.is_symlink()]
    return sorted(steps, reverse=True)


def whole_steps(root: Path) -> list[int]:
    """Steps of the directories that are whole checkpoints (manifest and files of the recorded sizes),
    newest first; a stray step-N directory without them is neither kept, counted, nor removed."""
    return [s for s in list_checkpoints(root) if verify(root / step_dir_name(s), hashes=False)[1] is None]


def load_latest(directory: str | os.PathLike, *, template: dict[str, Any] | None = None,
                map_location: str | torch.device = "cpu",
                allow_simulated: bool = False) -> tuple[dict[str, Any], int] | None:
    """The newest checkpoint that verifies, as (state, step); None when there is none.

    Truncated or corrupted checkpoints are skipped with a warning naming what was wrong, falling back
    to the previous good one. Sharded checkpoints load in place into ``template`` (DCP's contract).
    CheckpointError when a real run would resume from a simulated NPU's checkpoint (``allow_simulated``).
    """
    with comm_busy(f"loading a checkpoint from {directory}"):
        return _load_latest(Path(directory), template, map_location, allow_simulated=allow_simulated)


def _load_latest(root: Path, template: dict[str, Any] | None, map_location: str | torch.device, *,
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
