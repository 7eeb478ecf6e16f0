"""Swish, x * sigmoid(beta * x), as a custom operator with its backward as a second operator.

The worked example of npudist.ops.custom: with beta = 1 it is torch.nn.SiLU, which is how the tests
check it. beta is a 0-dim tensor so it can be learned; ``Swish(learnable=False)`` keeps it fixed.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from npudist.ops.ctypes_kernel import CtypesKernel
from npudist.ops.custom import KernelDeclined, Operator, define


def _check_beta(beta: Tensor) -> None:
    torch._check(beta.dim() == 0,
                 lambda: f"swish: beta must be a 0-dim tensor, got shape {tuple(beta.shape)}")


def _swish_reference(x: Tensor, beta: Tensor) -> Tensor:
    _check_beta(beta)
    return x * torch.sigmoid(beta * x)


def _swish_fake(x: Tensor, beta: Tensor) -> Tensor:
    _check_beta(beta)
    return torch.empty_like(x)


def _swish_backward_reference(grad: Tensor, x: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    # d/dx x*s(bx) = s + b*x*s*(1-s);  d/db x*s(bx) = x^2 * s*(1-s), summed over every element.
    s = torch.sigmoid(beta * x)
    ds = s * (1 - s)
    grad_x = grad * (s + beta * x * ds)
    grad_beta = (grad * x * x * ds).sum().to(beta.dtype)
    return grad_x, grad_beta


def _swish_backward_fake(grad: Tensor, x: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(beta)


swish_backward: Operator = define("npudist::swish_backward", _swish_backward_reference,
                                  fake=_swish_backward_fake)


def _setup_context(ctx, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    x, beta = inputs
    ctx.save_for_backward(x, beta)


def _backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
    x, beta = ctx.saved_tensors
    grad_x, grad_beta = swish_backward(grad, x, beta)
    return (grad_x if ctx.needs_input_grad[0] else None,
            grad_beta if ctx.needs_input_grad[1] else None)


swish: Operator = define("npudist::swish", _swish_reference, fake=_swish_fake,
                         backward=_backward, setup_context=_setup_context)
"""``swish(x, beta)``: x * sigmoid(beta * x), beta a 0-dim tensor; ``torch.ops.npudist.swish`` too."""


def register_swish_kernel(device_type: str, kernel: CtypesKernel, description: str = "") -> bool:
    """Use a vendor library's forward kernel for swish on ``device_type`` (scalar argument: beta).

    The kernel must take one tensor and one scalar (see npudist.ops.ctypes_kernel). Returns True when
    registered now, False when it waits for the device type to exist (``npu`` before torch_npu loads).
    """
    if kernel.n_inputs != 1 or kernel.n_scalars != 1:
        raise ValueError(f"a swish kernel takes 1 tensor and 1 scalar (beta); {kernel.symbol} declares "
                         f"{kernel.n_inputs} and {kernel.n_scalars}")

    def run(x: Tensor, beta: Tensor) -> Tensor:
        _check_beta(beta)
        if beta.dtype != x.dtype:
            raise KernelDeclined("beta and x differ in dtype")
        return kernel(x, scalars=(float(beta),))

    return swish.register_kernel(device_type, run, description or f"{kernel.symbol} from {kernel.library}")


class Swish(nn.Module):
    """Swish activation through the custom operator: a device kernel where one is registered, else the
    reference. ``Swish(1.0, learnable=False)`` computes exactly what torch.nn.SiLU computes."""

    def __init__(self, beta: float = 1.0, *, learnable: bool = False) -> None:
        super().__init__()
        value = torch.tensor(float(beta))
        if learnable:
            self.beta = nn.Parameter(value)
        else:
            self.register_buffer("beta", value)

    def forward(self, x: Tensor) -> Tensor:
        return swish(x, self.beta.to(dtype=x.dtype))

    def implementation(self, device_type: str | None = None) -> str:
        """What runs on ``device_type`` (default: where beta lives): a kernel, or ``reference``."""
        return swish.implementation(device_type or self.beta.device.type)

    def extra_repr(self) -> str:
        learnable = isinstance(self.beta, nn.Parameter)
        return f"beta={float(self.beta):g}, learnable={learnable}, implementation={self.implementation()!r}"
