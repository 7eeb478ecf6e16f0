"""Shared test plumbing: run npudist (and real ranks) in subprocesses against this checkout's source."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
FAKES = REPO / "tests" / "fakes"


def child_env(extra: dict[str, str] | None = None, pythonpath: list[Path] | None = None) -> dict[str, str]:
    """Environment for a child process that imports this checkout's npudist, never an installed copy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPUDIST_", "OMPI_", "PMI_", "SLURM_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"):
        env.pop(k, None)
    paths = [str(p) for p in (pythonpath or [])] + [str(SRC)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def run_py(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python ARGS` with this checkout on the path; output captured as text; never hangs past timeout."""
    return subprocess.run([sys.executable, *args], env=env or child_env(), cwd=cwd or REPO, text=True,
                          capture_output=True, timeout=timeout, check=False)


def run_npudist(args: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return run_py(["-m", "npudist", *args], **kw)


@pytest.fixture
def repo() -> Path:
    return REPO
