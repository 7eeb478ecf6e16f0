"""Tests marked ``cuda`` need an NVIDIA GPU: skipped here, with the reason, where torch sees none."""

from __future__ import annotations

import pytest


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
    marked = [item for item in items if item.get_closest_marker("cuda")]
    reason = cuda_missing() if marked else None
    if reason:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))
