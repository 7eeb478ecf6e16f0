"""Whether the installed numpy can work with the installed torch, read from package metadata (no import).

torch before 2.3 was built against numpy 1.x; with numpy 2 its numpy bridge is off, and the first
``torch.from_numpy``/``tensor.numpy()`` raises ``RuntimeError: Numpy is not available`` (torch 2.3's
release notes: the first release built against numpy 2.0). That message names neither package's version nor
the fix, so the doctor and launch say it instead.
"""

from __future__ import annotations

import importlib.metadata
import re

NUMPY2_SINCE = (2, 3)
"""The first torch built against numpy 2."""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def mismatch(torch_version: str | None, numpy_version: str | None) -> str | None:
    """What is wrong and the fix, or None when the pair works (or either is not installed)."""
    if not torch_version or not numpy_version:
        return None
    if _version(torch_version)[:2] >= NUMPY2_SINCE or _version(numpy_version)[:1] < (2,):
        return None
    return (f"numpy {numpy_version} is installed, but torch {torch_version} was built against numpy 1.x (numpy 2 "
            f"support starts at torch {'.'.join(map(str, NUMPY2_SINCE))}): converting between tensors and numpy "
            "fails with `RuntimeError: Numpy is not available`. Fix: pip install \"numpy<2\" (or a torch >= 2.3 "
            "where your accelerator stack allows)")


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_mismatch() -> str | None:
    """``mismatch`` for the torch and numpy this interpreter would import."""
    return mismatch(installed("torch"), installed("numpy"))
