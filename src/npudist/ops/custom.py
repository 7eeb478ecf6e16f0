"""Define a custom operator once: reference, fake, per-device kernels and autograd over torch.library.

``torch.library.custom_op`` (torch >= 2.4) already dispatches by device, traces under torch.compile and
works with autograd; this module only adds what people get wrong by hand: a reference implementation
that stays the fallback on every device without a kernel, kernels for devices whose torch type is only
known once the vendor package is imported (``npu`` after ``torch_npu``, ``mlu`` after ``torch_mlu``),
and kernels that may decline an input (an unsupported dtype) and hand it back to the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from npudist.runtime import compat

MIN_TORCH = compat.FEATURES["custom_op"].since


class OpsUnavailable(compat.TorchTooOld):
    """This torch cannot define custom operators (torch.library.custom_op arrived in torch 2.4)."""


class KernelDeclined(Exception):  # a signal, not a failure: the reference takes over
    """Raised by a device kernel for inputs it does not handle; the operator runs the reference instead."""


def require_custom_op() -> Callable[..., Any]:
    """torch.library.custom_op, or OpsUnavailable naming the torch version and what to do."""
    custom_op = getattr(getattr(torch, "library", None), "custom_op", None)
    if custom_op is None or not compat.has("custom_op"):
        raise OpsUnavailable(
            f"npudist.ops needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (torch.library.custom_op); this is "
            f"torch {torch.__version__}. Upgrade torch (and the matching torch_npu/torch_mlu), or use the "
            "reference function directly without the custom operator."
        )
    return custom_op


def device_type_known(device_type: str) -> bool:
    """Whether torch can name this device type yet (``npu`` exists only after ``import torch_npu``)."""
    try:
        torch.device(device_type)
    except RuntimeError:
        return False
    return True


@dataclass
class Operator:
    """A defined operator: call it like a function; ``implementation(device_type)`` says what runs where."""

    name: str
    op: Any
    """The ``torch.library.CustomOpDef``; ``torch.ops.<namespace>.<name>`` is the same operator."""
    reference: Callable[..., Any]
    registered: dict[str, str] = field(default_factory=dict)
    """device type -> description of the kernel registered with torch's dispatcher."""
    pending: dict[str, tuple[Callable[..., Any], str]] = field(default_factory=dict)
    """Kernels for device types torch does not know yet; registered on first use of such a device."""

    def __call__(self, *args: Any) -> Any:
        if self.pending:
            for a in args:
                if isinstance(a, torch.Tensor) and a.device.type in self.pending:
                    self.register_kernel(a.device.type, *self.pending[a.device.type])
        return self.op(*args)

    def register_kernel(self, device_type: str, kernel: Callable[..., Any], description: str = "") -> bool:
        """Route ``device_type`` tensors to ``kernel``; True when torch registered it now, False if pending.

        A kernel that raises KernelDeclined for an input gets the reference implementation run instead,
        so a kernel with a narrow dtype set never turns into an error for the user.
        """
        reference = self.reference
        label = description or getattr(kernel, "__name__", repr(kernel))

        def run(*args: Any) -> Any:
            try:
                return kernel(*args)
            except KernelDeclined:
                return reference(*args)

        if not device_type_known(device_type):
            self.pending[device_type] = (kernel, label)
            return False
        self.op.register_kernel(device_type, run)
        self.pending.pop(device_type, None)
        self.registered[device_type] = label
        return True

    def implementation(self, device_type: str) -> str:
        """What runs for tensors on ``device_type``: a kernel's description or ``"reference"``."""
        if device_type in self.registered:
            return f"kernel: {self.registered[device_type]}"
        if device_type in self.pending:
            return f"kernel (registers on first use): {self.pending[device_type][1]}"
        return "reference"


def define(
    qualname: str,
    reference: Callable[..., Any],
    *,
    fake: Callable[..., Any],
    kernels: Mapping[str, Callable[..., Any]] | None = None,
    backward: Callable[..., Any] | None = None,
    setup_context: Callable[..., Any] | None = None,
) -> Operator:
    """Define ``namespace::name`` from a type-annotated reference implementation.

    - ``reference`` runs on every device without a kernel, so write it with torch ops only;
    - ``fake`` returns empty tensors of the output's shape/dtype/device (used by torch.compile, meta);
    - ``kernels`` maps device types (``npu``, ``cuda``, ``mlu``, ``cpu``) to faster implementations;
    - ``backward``/``setup_context`` follow torch.library.register_autograd; let backward call another
      operator defined here so the gradient also has a kernel per device and traces as one node.
    """
    custom_op = require_custom_op()
    if "::" not in qualname:
        raise ValueError(f"operator name {qualname!r} must be 'namespace::name', e.g. 'npudist::swish'")
    op = custom_op(qualname, mutates_args=())(reference)
    op.register_fake(fake)
    if (backward is None) != (setup_context is None):
        raise ValueError(f"{qualname}: give both backward and setup_context, or neither")
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    operator = Operator(qualname, op, reference)
    for device_type, kernel in (kernels or {}).items():
        operator.register_kernel(device_type, kernel)
    return operator
