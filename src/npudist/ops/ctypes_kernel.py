"""Device kernels from a vendor shared library, called through ctypes.

This is how Ascend C / ACL custom kernels usually reach Python without a C++ extension build: the
vendor toolchain produces a ``.so`` with a host-callable launcher, and the caller passes raw data
pointers. Kernels declare constraints (contiguous memory, an aligned data pointer, a dtype set):
Ascend C's DataCopy works on 32-byte aligned blocks (Ascend C API reference, DataCopy), and
hand-tuned kernels often assume more, hence the 128-byte default. An input that breaks a layout
constraint is copied into an aligned contiguous buffer, never rejected; a tensor view (a slice, a
transpose) breaks them easily, whatever the allocator's own alignment.

Calling convention (npudist's, for the thin C wrapper a vendor kernel is exported through)::

    int SYMBOL(const T *in0, ..., const T *inN, T *out, int64_t numel, double s0, ..., double sK);

It returns 0 on success; any other value is an error code raised as KernelError. Ascend C kernels
launched with ``aclrtlaunch_<name>(blockDim, stream, ...)`` need such a wrapper that supplies the
block count and current stream.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from npudist.ops.custom import KernelDeclined


class KernelError(RuntimeError):
    """A vendor kernel library could not be loaded, lacks its symbol, or returned an error code."""


@dataclass(frozen=True)
class KernelConstraints:
    """What a kernel requires of every tensor it reads or writes."""

    dtypes: frozenset[torch.dtype] = frozenset({torch.float32})
    contiguous: bool = True
    alignment: int = 128
    """Bytes the data pointer must be a multiple of (1 means any)."""

    def __post_init__(self) -> None:
        if self.alignment < 1 or self.alignment & (self.alignment - 1):
            raise ValueError(f"alignment must be a power of two bytes, got {self.alignment}")
        if not self.dtypes:
            raise ValueError("a kernel must accept at least one dtype")


def layout_problems(t: torch.Tensor, c: KernelConstraints) -> list[str]:
    """Why ``t`` cannot be handed to the kernel as it is (empty list: it can)."""
    problems = []
    if c.contiguous and not t.is_contiguous():
        problems.append("not contiguous")
    if t.data_ptr() % c.alignment:
        problems.append(f"data pointer {t.data_ptr():#x} not {c.alignment}-byte aligned")
    return problems


def aligned_empty(shape: torch.Size | tuple[int, ...], dtype: torch.dtype, device: torch.device | str,
                  alignment: int) -> torch.Tensor:
    """An uninitialised contiguous tensor whose data pointer is a multiple of ``alignment`` bytes."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for s in shape:
        numel *= int(s)
    raw = torch.empty(numel * itemsize + alignment, dtype=torch.uint8, device=device)
    skip = (-raw.data_ptr()) % alignment
    if skip % itemsize:  # every allocator we know returns at least itemsize-aligned memory
        raise KernelError(f"allocator returned a pointer {raw.data_ptr():#x} not aligned to {itemsize} bytes")
    return raw[skip : skip + numel * itemsize].view(dtype).view(tuple(shape))


def conform(t: torch.Tensor, c: KernelConstraints) -> tuple[torch.Tensor, bool]:
    """``t`` itself if it meets the layout constraints, else an aligned contiguous copy (and True)."""
    if not layout_problems(t, c):
        return t, False
    out = aligned_empty(t.shape, t.dtype, t.device, c.alignment)
    out.copy_(t)
    return out, True


@dataclass
class CtypesKernel:
    """An elementwise-style kernel ``SYMBOL`` in shared library ``library`` (see the module docstring).

    Loading happens at construction, so a missing file or symbol is reported where the kernel is
    declared, not at the first forward pass.
    """

    library: str
    symbol: str
    n_inputs: int = 1
    n_scalars: int = 0
    constraints: KernelConstraints = field(default_factory=KernelConstraints)
    copies: int = 0
    """Inputs copied so far because they broke a layout constraint."""
    _fn: ctypes._CFuncPtr | None = field(default=None, init=False, repr=False)  # type: ignore[name-defined]

    _RESTYPE: ClassVar[type] = ctypes.c_int

    def __post_init__(self) -> None:
        if not os.path.exists(self.library):
            raise KernelError(f"kernel library {self.library!r} does not exist; build it or fix the path")
        try:
            lib = ctypes.CDLL(os.path.abspath(self.library))
        except OSError as exc:
            raise KernelError(f"cannot load kernel library {self.library!r}: {exc} (check that its "
                              "dependencies are on LD_LIBRARY_PATH and it matches this CPU architecture)"
                              ) from exc
        try:
            fn = getattr(lib, self.symbol)
        except AttributeError:
            raise KernelError(f"kernel library {self.library!r} exports no symbol {self.symbol!r}; "
                              f"list its symbols with `nm -D {self.library}` (a C++ kernel needs "
                              'extern "C" to keep its name unmangled)') from None
        fn.restype = self._RESTYPE
        fn.argtypes = ([ctypes.c_void_p] * (self.n_inputs + 1) + [ctypes.c_int64]
                       + [ctypes.c_double] * self.n_scalars)
        self._fn = fn

    def __call__(self, *inputs: torch.Tensor, scalars: tuple[float, ...] = ()) -> torch.Tensor:
        """Run the kernel on same-shaped ``inputs``; the output has their shape, dtype and device.

        Raises KernelDeclined for a dtype outside the declared set, so an Operator falls back.
        """
        if len(inputs) != self.n_inputs or len(scalars) != self.n_scalars:
            raise KernelError(f"{self.symbol} takes {self.n_inputs} tensors and {self.n_scalars} scalars, "
                              f"got {len(inputs)} and {len(scalars)}")
        first = inputs[0]
        for t in inputs:
            if t.dtype not in self.constraints.dtypes:
                raise KernelDeclined(f"{self.symbol} does not take {t.dtype}")
            if t.shape != first.shape or t.device != first.device:
                raise KernelError(f"{self.symbol}: inputs differ in shape or device ({tuple(t.shape)} "
                                  f"on {t.device} vs {tuple(first.shape)} on {first.device})")
        ready = []
        for t in inputs:
            c, copied = conform(t, self.constraints)
            self.copies += copied
            ready.append(c)
        out = aligned_empty(first.shape, first.dtype, first.device, self.constraints.alignment)
        if out.numel():
            assert self._fn is not None
            code = self._fn(*(t.data_ptr() for t in ready), out.data_ptr(), out.numel(),
                            *(float(s) for s in scalars))
            if code != 0:
                raise KernelError(f"{self.symbol} in {self.library} returned error code {code}")
        return out
