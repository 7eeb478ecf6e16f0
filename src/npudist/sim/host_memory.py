"""What follows from the simulated NPU's memory being host memory: pinning is a copy, a scalar read is a read.

With torch_npu, ``tensor.pin_memory()`` and ``DataLoader(pin_memory=True)`` page-lock host memory through
the NPU's allocator; the simulated NPU has none (torch asks PrivateUse1's hooks for one and raises), so
pinning is a copy and ``is_pinned`` is False: a ported script's loaders run, and nothing about pinning's
speed is claimed. ``torch.tensor([npu_scalar, 3])`` reads a scalar through ``aten::_local_scalar_dense``,
which the simulated tensor answers from its host copy.
"""

from __future__ import annotations

from typing import Any

import torch


def register(library: torch.library.Library) -> None:
    """Into the simulation's ``aten`` library (installed once per process by npudist.sim.install)."""
    library.impl("_pin_memory", _pin, "CPU")
    library.impl("is_pinned", _is_pinned, "CPU")
    library.impl("_local_scalar_dense", _scalar, "PrivateUse1")


def _pin(tensor: torch.Tensor, device: Any = None) -> torch.Tensor:
    return tensor.clone()


def _is_pinned(tensor: torch.Tensor, device: Any = None) -> bool:
    return False


def _scalar(tensor: Any) -> Any:
    return tensor.elem.item()
