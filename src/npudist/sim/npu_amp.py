"""``torch.npu.amp`` (also ``torch_npu.npu.amp``) of the simulated NPU: torch_npu's AMP names over ``torch.amp``.

torch_npu's own are thin: ``autocast`` is ``torch.autocast("npu")`` with float16 as its default dtype, and
``GradScaler`` is torch's scaler for ``npu`` with a ``dynamic`` switch for a fixed scale
(torch_npu/npu/amp/autocast_mode.py, grad_scaler.py; ``__all__`` of torch_npu/npu/amp/__init__.py). The casts
themselves are sim/autocast.py's kernels.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch

from npudist.sim.tensor import DEVICE_TYPE


class autocast(torch.amp.autocast_mode.autocast):  # torch_npu's name, lower case
    """``torch.npu.amp.autocast(enabled, dtype, cache_enabled)``: ``torch.autocast("npu", ...)``, float16
    unless told otherwise."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> None:
        super().__init__(DEVICE_TYPE, enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.npu.amp.GradScaler``: torch's scaler on ``npu``; ``dynamic=False`` keeps ``init_scale``."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, dynamic: bool = True, enabled: bool = True) -> None:
        super().__init__(DEVICE_TYPE, init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
        self._dynamic = dynamic

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        if new_scale is None and not self._dynamic and self.is_enabled():
            new_scale = float(self._init_scale)
        super().update(new_scale)


def custom_fwd(fwd: Callable[..., Any] | None = None, *, cast_inputs: torch.dtype | None = None) -> Any:
    return functools.partial(torch.amp.custom_fwd, device_type=DEVICE_TYPE)(fwd=fwd, cast_inputs=cast_inputs)


def custom_bwd(bwd: Callable[..., Any]) -> Any:
    return functools.partial(torch.amp.custom_bwd, device_type=DEVICE_TYPE)(bwd)


NAMES = ("autocast", "GradScaler", "custom_fwd", "custom_bwd")


def module() -> types.ModuleType:
    """A fresh ``torch.npu.amp`` module object; its ``autocast_mode``, ``grad_scaler`` and ``common`` are itself
    (transfer_to_npu points torch.cuda.amp's submodules at them)."""
    amp = types.ModuleType("torch.npu.amp", __doc__)
    for name in NAMES:
        setattr(amp, name, globals()[name])
    amp.__all__ = list(NAMES)
    amp.autocast_mode = amp.grad_scaler = amp.common = amp
    return amp
