"""npudist: distributed PyTorch that runs the same way on NPUs, GPUs, MLUs, RK3588 boards and CPUs.

The public names load on first use, so ``import npudist`` (and the CLI that explains a broken vendor
stack) works even where ``import torch`` fails.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from npudist._version import __version__

if TYPE_CHECKING:
    from npudist.accelerators import Accelerator, AcceleratorUnavailable, accelerator
    from npudist.comm import all_gather, all_reduce, all_reduce_many, broadcast, constraints, reduce_scatter
    from npudist.comm.ddp import ddp
    from npudist.dist import DistContext, DistInitError, init, shutdown

_EXPORTS: dict[str, str] = {
    "Accelerator": "npudist.accelerators",
    "AcceleratorUnavailable": "npudist.accelerators",
    "accelerator": "npudist.accelerators",
    "all_gather": "npudist.comm",
    "all_reduce": "npudist.comm",
    "all_reduce_many": "npudist.comm",
    "broadcast": "npudist.comm",
    "constraints": "npudist.comm",
    "reduce_scatter": "npudist.comm",
    "ddp": "npudist.comm.ddp",
    "DistContext": "npudist.dist",
    "DistInitError": "npudist.dist",
    "init": "npudist.dist",
    "shutdown": "npudist.dist",
}
_SUBPACKAGES = frozenset({"accelerators", "checkpoint", "comm", "dashboards", "dist", "doctor", "infer", "ops",
                          "report", "telemetry"})

__all__ = [
    "Accelerator",
    "AcceleratorUnavailable",
    "DistContext",
    "DistInitError",
    "__version__",
    "accelerator",
    "all_gather",
    "all_reduce",
    "all_reduce_many",
    "broadcast",
    "constraints",
    "ddp",
    "init",
    "reduce_scatter",
    "shutdown",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"npudist.{name}")
    else:
        raise AttributeError(f"module 'npudist' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBPACKAGES})
