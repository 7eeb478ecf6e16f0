"""npudist: distributed PyTorch that runs the same way on NPUs, GPUs, MLUs, RK3588 boards and CPUs.

The public names load on first use, so ``import npudist`` (and the CLI that explains a broken vendor
stack) works even where ``import torch`` fails.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from npudist._version import __version__

if TYPE_CHECKING:
    from npudist.accelerators import Accelerator, AcceleratorUnavailable, accelerator
    from npudist.comm import active_constraints as constraints
    from npudist.comm import all_gather, all_reduce, all_reduce_many, broadcast, busy, reduce_scatter
    from npudist.lifecycle import DistContext, DistInitError, init, shutdown
    from npudist.training import ddp, log, loop, step

# Public name -> (module, attribute there).
_EXPORTS: Mapping[str, tuple[str, str]] = MappingProxyType({
    "Accelerator": ("npudist.accelerators", "Accelerator"),
    "AcceleratorUnavailable": ("npudist.accelerators", "AcceleratorUnavailable"),
    "accelerator": ("npudist.accelerators", "accelerator"),
    "all_gather": ("npudist.comm", "all_gather"),
    "all_reduce": ("npudist.comm", "all_reduce"),
    "all_reduce_many": ("npudist.comm", "all_reduce_many"),
    "broadcast": ("npudist.comm", "broadcast"),
    "busy": ("npudist.comm", "busy"),
    "constraints": ("npudist.comm", "active_constraints"),
    "reduce_scatter": ("npudist.comm", "reduce_scatter"),
    "ddp": ("npudist.training", "ddp"),
    "log": ("npudist.training", "log"),
    "loop": ("npudist.training", "loop"),
    "step": ("npudist.training", "step"),
    "DistContext": ("npudist.lifecycle", "DistContext"),
    "DistInitError": ("npudist.lifecycle", "DistInitError"),
    "init": ("npudist.lifecycle", "init"),
    "shutdown": ("npudist.lifecycle", "shutdown"),
})
_SUBPACKAGES = frozenset({"accelerators", "checkpoint", "comm", "dashboards", "doctor", "edge", "infer", "lifecycle",
                          "migrate", "ops", "report", "runtime", "telemetry", "training"})

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
    "busy",
    "constraints",
    "ddp",
    "init",
    "log",
    "loop",
    "reduce_scatter",
    "shutdown",
    "step",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attribute = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attribute)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"npudist.{name}")
    else:
        raise AttributeError(f"module 'npudist' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBPACKAGES})
