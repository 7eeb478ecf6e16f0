"""`npudist migrate`: find the CUDA-only code of a training script and rewrite it for any accelerator.

The names load on first use, so the `npudist` command (which registers `migrate`) starts in environments
without libcst, such as the RKNN toolkit's.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Any

_EXPORTS = MappingProxyType({"RULES": "rules", "Rule": "rules", "Analysis": "scan", "Finding": "scan",
                             "analyse": "scan", "Fixed": "fix", "apply": "fix"})
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'npudist.migrate' has no attribute {name!r}")
    return getattr(importlib.import_module(f"npudist.migrate.{_EXPORTS[name]}"), name)
