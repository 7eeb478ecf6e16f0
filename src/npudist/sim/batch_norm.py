"""The five batch-norm kernels ``nn.SyncBatchNorm`` calls, for the simulated NPU, on host tensors.

torch registers ``batch_norm_stats`` and its siblings for CUDA only (a vendor registers its own:
torch_npu does), so SyncBatchNorm on any other device stops at its first call. These compute what the
CUDA kernels compute (aten/src/ATen/native/cuda/Normalization.cu: per-channel statistics over every
dimension but 1, combined across ranks by counts, the unbiased variance in the running estimate), in
float32 for reduced-precision inputs as CUDA's accumulate type does. Plain CPU tensors in and out:
tensor.py runs them for simulated tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch

aten = torch.ops.aten


def _acc(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _per_channel(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [C] vector shaped to broadcast over ``like``'s channel dimension (1)."""
    return t.reshape(1, -1, *([1] * (like.dim() - 2)))


def _dims(x: torch.Tensor) -> list[int]:
    return [d for d in range(x.dim()) if d != 1]


def stats(input: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = _acc(input)
    mean = x.mean(_dims(x))
    var = x.var(_dims(x), unbiased=False)
    return mean, torch.rsqrt(var + eps)


def gather_stats_with_counts(input: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                             running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                             momentum: float, eps: float, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's (mean, invstd, count) -> the global mean and invstd; updates the running estimates."""
    counts = counts.to(mean.dtype).reshape(-1, 1)
    total = counts.sum()
    global_mean = (counts * mean).sum(0) / total
    var_each = 1.0 / (invstd * invstd) - eps
    var = (counts * (var_each + (mean - global_mean) ** 2)).sum(0) / total
    if running_mean is not None:
        running_mean.mul_(1 - momentum).add_((momentum * global_mean).to(running_mean.dtype))
    if running_var is not None:
        unbiased = var * total / (total - 1)
        running_var.mul_(1 - momentum).add_((momentum * unbiased).to(running_var.dtype))
    return global_mean, torch.rsqrt(var + eps)


def elemt(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, mean: torch.Tensor,
          invstd: torch.Tensor, eps: float) -> torch.Tensor:
    y = (_acc(input) - _per_channel(mean, input)) * _per_channel(invstd, input)
    if weight is not None:
        y = y * _per_channel(_acc(weight), input)
    if bias is not None:
        y = y + _per_channel(_acc(bias), input)
    return y.to(input.dtype)


def backward_reduce(grad_out: torch.Tensor, input: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                    weight: torch.Tensor | None, input_g: bool, weight_g: bool,
                    bias_g: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's sums for the input gradient, and the weight and bias gradients."""
    dy, x = _acc(grad_out), _acc(input)
    sum_dy = dy.sum(_dims(dy))
    sum_dy_xmu = (dy * (x - _per_channel(mean, x))).sum(_dims(dy))
    dtype = weight.dtype if weight is not None else mean.dtype
    return sum_dy, sum_dy_xmu, (sum_dy_xmu * invstd).to(dtype), sum_dy.to(dtype)


def backward_elemt(grad_out: torch.Tensor, input: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                   weight: torch.Tensor | None, sum_dy: torch.Tensor, sum_dy_xmu: torch.Tensor,
                   count: torch.Tensor) -> torch.Tensor:
    """The input gradient from the sums every rank contributed (already all-reduced)."""
    total = count.sum().to(mean.dtype)
    mean_dy, mean_dy_xmu = sum_dy / total, sum_dy_xmu / total
    x, dy = _acc(input), _acc(grad_out)
    scale = invstd if weight is None else invstd * _acc(weight)
    grad = (dy - _per_channel(mean_dy, x)
            - (x - _per_channel(mean, x)) * _per_channel(invstd * invstd * mean_dy_xmu, x)) * _per_channel(scale, x)
    return grad.to(input.dtype)


KERNELS: Mapping[Any, Callable[..., Any]] = MappingProxyType({
    aten.batch_norm_stats.default: stats,
    aten.batch_norm_gather_stats_with_counts.default: gather_stats_with_counts,
    aten.batch_norm_elemt.default: elemt,
    aten.batch_norm_backward_reduce.default: backward_reduce,
    aten.batch_norm_backward_elemt.default: backward_elemt,
})
"""aten op -> its host kernel; SimTensor.__torch_dispatch__ runs these instead of the op."""
