"""npudist.ops.Swish on CUDA tensors: torch.library.opcheck passes, and beta = 1 matches torch's SiLU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from npudist.ops import Swish, swish, swish_backward

pytestmark = pytest.mark.cuda


@pytest.mark.timeout(120)
def test_opcheck_on_cuda() -> None:
    x = torch.randn(8, 16, device="cuda", requires_grad=True)
    beta = torch.tensor(1.3, device="cuda", requires_grad=True)
    torch.library.opcheck(swish.op, (x, beta))  # schema, fake tensor, autograd registration, AOT dispatch
    torch.library.opcheck(swish.op, (x.detach(), beta.detach()))
    torch.library.opcheck(swish_backward.op, (torch.randn(8, 16, device="cuda"), torch.randn(8, 16, device="cuda"),
                                              torch.tensor(0.7, device="cuda")))


# Swish computes x * sigmoid(x) in the input dtype (two roundings); torch's SiLU kernel computes in
# float32 and rounds once, so half precision may differ by a few units in the last place.
TOLERANCE = {torch.float32: (1e-5, 1e-6), torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
def test_matches_silu_on_cuda(dtype: torch.dtype) -> None:
    rtol, atol = TOLERANCE[dtype]
    torch.manual_seed(0)
    x = (torch.randn(4096, device="cuda") * 4).to(dtype).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    y = Swish(1.0).to("cuda")(x)
    y_ref = F.silu(x_ref)
    assert y.device.type == "cuda" and y.dtype == dtype
    torch.testing.assert_close(y, y_ref, rtol=rtol, atol=atol)
    grad = torch.randn_like(y)
    y.backward(grad)
    y_ref.backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=rtol, atol=atol)
