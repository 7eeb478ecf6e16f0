"""The Swish operator with a kernel registered for ``npu``: a C kernel run on the simulated device."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from npudist.runtime import compat
from tests.conftest import run_py
from tests.ops.test_ops_ctypes_kernel import EXPECTED, X, libswish  # noqa: F401  (fixture)

pytestmark = pytest.mark.subprocess


@pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")
def test_swish_runs_its_npu_kernel_on_the_simulated_device(libswish: Path) -> None:  # noqa: F811
    script = textwrap.dedent(f"""
        import torch
        from npudist.sim import install
        install("npu")
        from npudist.ops import CtypesKernel, Swish, register_swish_kernel
        k = CtypesKernel({str(libswish)!r}, "swish_f32", n_scalars=1)
        assert register_swish_kernel("npu", k, "libswish")
        m = Swish(1.0).to("npu")
        x = torch.tensor({X!r}, device="npu", requires_grad=True)
        y = m(x)
        y.sum().backward()
        print(m.implementation(), y.device, x.grad.device)
        print([round(v, 6) for v in y.tolist()])
        print([round(v, 6) for v in x.grad.tolist()])
    """)
    proc = run_py(["-c", script], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    where, values, grads = proc.stdout.strip().splitlines()
    assert where == "kernel: libswish npu:0 npu:0"
    assert [float(v) for v in values.strip("[]").split(", ")] == pytest.approx(EXPECTED, abs=1e-5)
    assert [float(v) for v in grads.strip("[]").split(", ")] == pytest.approx(
        [0.5, 0.9276705, 0.0723295, 1.0907842], abs=1e-5)
