"""Whether a checkpoint was written by a simulated NPU, so a real run never resumes from one unawares.

The simulated NPU (npudist.sim) runs the same training on the CPU; its weights are real numbers but were
never trained on the device the next run uses, and a run directory reused after ``make demo`` or a
``--simulate`` rehearsal would otherwise resume from them silently. The manifest records the simulation
mode; ``load_latest`` refuses such a checkpoint in a real run unless told it may.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from npudist.runtime.settings import SIMULATE_VAR

MANIFEST_KEY = "simulated"
"""Manifest field: the NPUDIST_SIMULATE mode that wrote the checkpoint; absent for a real device."""


def current_mode(env: os._Environ[str] | dict[str, str] | None = None) -> str | None:
    """This process's simulation mode (NPUDIST_SIMULATE), or None on a real device."""
    return (os.environ if env is None else env).get(SIMULATE_VAR) or None


def stamp(manifest: dict[str, Any], mode: str | None) -> dict[str, Any]:
    """``manifest`` with the simulation mode recorded when there is one."""
    return {**manifest, MANIFEST_KEY: mode} if mode else manifest


def refusal(manifest: dict[str, Any], path: Path, mode: str | None, allow: bool) -> str | None:
    """Why a run in ``mode`` must not resume from ``path`` (manifest ``manifest``), or None."""
    written = manifest.get(MANIFEST_KEY)
    if not written or mode or allow:
        return None
    return (f"{path} was written by a simulated NPU run ({SIMULATE_VAR}={written!s:.40}) and this run is on a real "
            f"device: resuming would continue from weights the simulator trained. Fix: give this run its own "
            f"run directory, or remove {path.parent}/step-* to start fresh, or pass allow_simulated=True "
            "(examples/train_ddp.py: --resume-simulated) to resume from it on purpose.")
