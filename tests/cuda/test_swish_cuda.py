"""npudist.ops.Swish on CUDA tensors: torch.library.opcheck passes, and beta = 1 matches torch's SiLU.

The SiLU comparison also runs in CI on the simulated NPU (the same function, in a child process that installs
the simulation); opcheck stays CUDA-only (its fake-tensor and AOT checks need a device with C++ kernels)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from npudist.ops import Swish, swish, swish_backward
from npudist.runtime import compat
from tests.conftest import REPO, child_env, run_py


@pytest.mark.cuda
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


def compare_with_silu(device: str, dtype: torch.dtype) -> None:
    """Swish(1.0) against F.silu on ``device``: values and gradients within TOLERANCE[dtype]."""
    rtol, atol = TOLERANCE[dtype]
    torch.manual_seed(0)
    x = (torch.randn(4096, device=device) * 4).to(dtype).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    y = Swish(1.0).to(device)(x)
    y_ref = F.silu(x_ref)
    assert y.device.type == device and y.dtype == dtype
    torch.testing.assert_close(y, y_ref, rtol=rtol, atol=atol)
    grad = torch.randn_like(y)
    y.backward(grad)
    y_ref.backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=rtol, atol=atol)


@pytest.mark.cuda
@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
def test_matches_silu_on_cuda(dtype: torch.dtype) -> None:
    compare_with_silu("cuda", dtype)


_SIM = """
from npudist.sim import install
install("npu")
from tests.cuda.test_swish_cuda import TOLERANCE, compare_with_silu
for dtype in TOLERANCE:
    compare_with_silu("npu", dtype)
    print("ok", dtype)
"""


@pytest.mark.subprocess
@pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")
@pytest.mark.timeout(240)
def test_matches_silu_on_the_simulated_npu() -> None:
    proc = run_py(["-c", _SIM], env=child_env(pythonpath=[REPO]), timeout=200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.split() == ["ok", "torch.float32", "ok", "torch.float16", "ok", "torch.bfloat16"]
