"""npudist.ops.define: fallback to the reference, pending device types, declined inputs, old torch."""

from __future__ import annotations

import uuid

import pytest
import torch
from torch import Tensor

import npudist.ops.custom as custom
from npudist.ops import KernelDeclined, OpsUnavailable, define


def _name() -> str:
    return f"npudist_test::op_{uuid.uuid4().hex[:8]}"  # torch.library names are process-global


def _double(x: Tensor) -> Tensor:
    return x * 2


def _double_fake(x: Tensor) -> Tensor:
    return torch.empty_like(x)


def test_reference_runs_without_a_kernel() -> None:
    op = define(_name(), _double, fake=_double_fake)
    assert op(torch.tensor([1.0, -3.0])).tolist() == [2.0, -6.0]
    assert op.implementation("cpu") == "reference"


def test_cpu_kernel_replaces_reference_and_declines_fall_back() -> None:
    def float32_only(x: Tensor) -> Tensor:
        if x.dtype != torch.float32:
            raise KernelDeclined("float32 only")
        return x * 2 + 100  # distinguishable from the reference on purpose

    op = define(_name(), _double, fake=_double_fake, kernels={"cpu": float32_only})
    assert op(torch.tensor([1.0])).tolist() == [102.0]
    assert op(torch.tensor([1.0], dtype=torch.float64)).tolist() == [2.0]
    assert op.implementation("cpu") == "kernel: float32_only"


def test_vendor_device_kernel_waits_until_torch_knows_the_device() -> None:
    # Plain torch has no "npu" or "mlu" device type until torch_npu / torch_mlu rename PrivateUse1.
    assert not custom.device_type_known("npu")
    op = define(_name(), _double, fake=_double_fake, kernels={"npu": _double, "cuda": _double})
    assert "cuda" in op.registered  # torch always knows cuda, with or without a GPU
    assert op.implementation("npu") == "kernel (registers on first use): _double"
    assert op(torch.tensor([4.0])).tolist() == [8.0]  # CPU tensors still take the reference


def test_backward_needs_setup_context() -> None:
    with pytest.raises(ValueError, match="give both backward and setup_context"):
        define(_name(), _double, fake=_double_fake, backward=lambda ctx, g: g)


def test_name_needs_a_namespace() -> None:
    with pytest.raises(ValueError, match="must be 'namespace::name'"):
        define("nonamespace", _double, fake=_double_fake)


def test_old_torch_gets_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.library, "custom_op")
    monkeypatch.setattr(torch, "__version__", "2.1.0")
    with pytest.raises(OpsUnavailable, match=r"torch >= 2\.4 .*this is torch 2\.1\.0"):
        define(_name(), _double, fake=_double_fake)
