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


def cuda_missing() -> str | None:
    """Why tests marked ``cuda`` cannot run here (None when a CUDA device is usable)."""
    import torch

    if torch.version.cuda is None:
        return f"needs an NVIDIA GPU: torch {torch.__version__} is built without CUDA (torch.version.cuda is None)"
    if not torch.cuda.is_available():
        return (f"needs an NVIDIA GPU: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none: "
                "torch.cuda.is_available() is False (no driver or no visible device)")
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` are skipped, with the reason, where no CUDA device is visible."""
    marked = [item for item in items if item.get_closest_marker("cuda")]
    reason = cuda_missing() if marked else None
    if reason:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))
