"""``torch.autocast("npu", enabled=True)`` on the simulated NPU: the casts autocast makes, as kernels.

torch dispatches an op under autocast to the ``AutocastPrivateUse1`` key first; torch_npu registers its cast
policy there in C++, and without kernels torch raises ("Could not run 'aten::linear' ... 'Autocastnpu'
backend"). The simulation registers the same two lists torch's CUDA policy uses (torch
aten/src/ATen/autocast_mode.cpp: ``lower_precision_fp`` and ``fp32``): matrix products and convolutions run
in the autocast dtype, reductions and losses in float32, and every other op falls through unchanged. The
kernels only cast, then run the op below autocast, so the arithmetic is the CPU's in that dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from npudist.sim.tensor import DEVICE_TYPE

KEY = "AutocastPrivateUse1"
# torch aten/src/ATen/autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, AutocastCUDA, m): lower_precision_fp ops.
LOWER_PRECISION = ("linear", "matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "addmv", "addr", "mv",
                   "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                   "convolution", "_convolution", "prelu", "einsum", "chain_matmul", "linalg_multi_dot",
                   "scaled_dot_product_attention")
# The same file's fp32 list (the ops whose range or accuracy needs float32), as far as training scripts use.
FLOAT32 = ("softmax", "log_softmax", "layer_norm", "native_layer_norm", "group_norm", "nll_loss", "nll_loss2d",
           "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "cross_entropy_loss",
           "binary_cross_entropy_with_logits", "exp", "log", "log1p", "pow", "rsqrt", "reciprocal",
           "logsumexp", "cosine_similarity", "cdist", "norm", "frobenius_norm")


def _eligible(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64 and \
        value.device.type == DEVICE_TYPE


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if _eligible(value):
        return value.to(dtype)
    if isinstance(value, list | tuple):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _kernel(op: Any, dtype_of: Callable[[], torch.dtype]) -> Callable[..., Any]:
    below = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def run(*args: Any, **kwargs: Any) -> Any:
        dtype = dtype_of()
        args, kwargs = _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(below):
            return op(*args, **kwargs)
    return run


def register(library: torch.library.Library) -> None:
    """Into the simulation's ``aten`` library; ``fallthrough`` is a ``_`` library (a fallback for all ops)."""
    for names, dtype_of in ((LOWER_PRECISION, lambda: torch.get_autocast_dtype(DEVICE_TYPE)),
                            (FLOAT32, lambda: torch.float32)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                library.impl(name if overload == "default" else f"{name}.{overload}", _kernel(op, dtype_of), KEY)


def fallthrough() -> torch.library.Library:
    """Every op not listed passes autocast unchanged (what torch registers for AutocastCUDA: ``m.fallback(
    makeFallthrough())``). Kept alive by the caller."""
    library = torch.library.Library("_", "IMPL")
    library.fallback(torch.library.fallthrough_kernel, dispatch_key=KEY)
    return library
