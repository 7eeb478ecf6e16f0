"""Tensors on the simulated ``npu`` device: a wrapper subclass whose data stay in host memory.

A ``SimTensor`` reports ``device=npu:0`` and the size, strides, storage offset and dtype of the CPU
tensor it holds. Every aten op reaches ``__torch_dispatch__``, which runs it on the held CPU tensors
and wraps the tensor results again, so the arithmetic is the CPU's own, bit for bit. Views keep their
aliasing because a view op on the held tensor returns a CPU view of the same storage. Factory calls
with ``device="npu"`` carry no tensor argument and reach the PrivateUse1 dispatch key instead; the
allocation ops that every factory decomposes into (``empty.memory_format``, ``empty_strided``) are
registered there and return SimTensors.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch

from npudist.sim import funcol, guard
from npudist.sim.batch_norm import KERNELS as HOST_KERNELS
from npudist.sim.rng import seeded
from npudist.sim.state import SIM

DEVICE_TYPE = "npu"

aten = torch.ops.aten




class SimTensor(torch.Tensor):
    """A tensor on ``npu:<index>`` whose data are the CPU tensor ``elem`` (index 0 unless the simulation's
    device guard is built: sim/guard.py)."""

    elem: torch.Tensor
    __slots__ = ("elem",)

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool = False, index: int = 0) -> SimTensor:
        if type(elem) is not torch.Tensor or elem.device.type != "cpu":
            raise TypeError(f"a simulated npu tensor holds a plain CPU tensor, got {type(elem).__name__} "
                            f"on {elem.device}")
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=f"{DEVICE_TYPE}:{index}", requires_grad=requires_grad,
        )
        r.elem = elem
        SIM.allocations.track(r, elem)
        return r

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"{self.elem!r}".replace("tensor(", "npu_tensor(", 1).rstrip(")") + f", device='{self.device}')"

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __format__(self, format_spec: str) -> str:
        # "{:6.2f}".format(acc) on a 0-d tensor: torch.Tensor.__format__ formats the value for exact Tensors only
        return self.elem.__format__(format_spec)

    def __reduce_ex__(self, protocol):
        # Pickled (torch.save, a checkpoint) as the host tensor: the simulated device's memory is host
        # memory, and a file holding only plain tensors loads anywhere with weights_only=True.
        return self.elem.__reduce_ex__(protocol)

    def data_ptr(self) -> int:
        """The host address of the data: what alignment rules (HCCL's, a kernel's) are checked against,
        as a real device tensor reports its device address. (The wrapper's own would be its storage
        offset from a null base.)"""
        return self.elem.data_ptr()

    def tolist(self) -> Any:
        """As on a real device tensor (torch refuses ``tolist`` for tensor subclasses)."""
        return self.elem.tolist()

    def __deepcopy__(self, memo: dict[int, Any]) -> SimTensor:
        # torch's default reads a wrapper's storage unless its data_ptr() is 0, which a view with an
        # offset does not satisfy; copy the host tensor instead (views of one storage stay views).
        if id(self) not in memo:
            new = SimTensor(self.elem.__deepcopy__(memo), requires_grad=self.requires_grad, index=self.device.index)
            new.__dict__.update(copy.deepcopy(self.__dict__, memo))
            memo[id(self)] = new
        return memo[id(self)]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        special = _SPECIAL.get(func)
        if special is not None:
            return special(*args, **kwargs)
        if func.namespace in _COLLECTIVE_NAMESPACES:
            # torch's functional collectives (DTensor, tensor parallel): their kernel hands the tensors to the
            # group named in the call, the simulated hccl, which needs them as device tensors; unwrapped, they
            # would reach it as host tensors and be refused as HCCL refuses them. A wait reaches the output whose
            # view it is given (funcol.py).
            return funcol.run(func, _keys("PrivateUse1"), args, kwargs)
        index = _chip(func, args, kwargs)
        host_kernel = HOST_KERNELS.get(func)
        if host_kernel is not None:  # an op torch has no CPU kernel for (batch_norm.py)
            return _wrap(host_kernel(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}), index)
        if _draws_from_device_generator(func, args, kwargs):
            out = SIM.rng.run(lambda: func(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}), _numel)
        else:
            out = func(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
        if _written(func):
            return _in_place_result(func, args, kwargs, out, index)
        return _wrap(out, index)

    def untyped_storage(self) -> torch.UntypedStorage:
        """The host storage: FSDP2 frees and reallocates an unsharded parameter's memory by resizing it
        (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, free_storage/alloc_storage), which a wrapper's
        own storage refuses ("invalid python storage"); resizing the host storage is the same act on the
        memory the tensor computes with."""
        return self.elem.untyped_storage()


_COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd", "_dtensor"})


@functools.cache
def _keys(key: str) -> torch._C.DispatchKeySet:
    """The dispatch key set of one key (``PrivateUse1``: the device's kernels; ``CPU``: the host's)."""
    return torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))


@functools.cache
def _generator_position(func: torch._ops.OpOverload) -> int | None:
    """Where a random op takes its generator (-1: it has no such argument); None for an op that draws none."""
    if not seeded(func):
        return None
    names = [a.name for a in func._schema.arguments]
    return names.index("generator") if "generator" in names else -1


def _draws_from_device_generator(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """A random op given no generator of its own draws from the device's (sim/rng.py)."""
    at = _generator_position(func)
    if at is None:
        return False
    own = kwargs.get("generator") is not None or (0 <= at < len(args) and args[at] is not None)
    return not own


def _numel(out: Any) -> int:
    first = out[0] if isinstance(out, tuple | list) and out else out
    return first.numel() if isinstance(first, torch.Tensor) else 0


def _unwrap(x: Any) -> Any:
    """SimTensors (also inside lists and tuples, as aten passes them) -> their host tensors; the npu
    device -> the CPU. Hand-written rather than pytree: this runs for every op (pytree doubled the cost)."""
    if isinstance(x, SimTensor):
        return x.elem
    if isinstance(x, list | tuple):
        return type(x)(_unwrap(v) for v in x) if any(isinstance(v, SimTensor | list | tuple) for v in x) else x
    if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
        return torch.device("cpu")
    return x


def _wrap(x: Any, index: int = 0) -> Any:
    if type(x) is torch.Tensor:
        return SimTensor(x, index=index) if x.device.type == "cpu" else x
    if isinstance(x, list | tuple):
        return type(x)(_wrap(v, index) for v in x)
    return x


def _chip(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> int:
    """The device index of an op's simulated tensors. Tensors on two of them are refused as torch refuses them
    on a real device, except by the copies between devices (``_SPECIAL``). Always 0 without the C++ guard."""
    if not guard.available():
        return 0
    if func in _BETWEEN_DEVICES:
        return args[0].device.index if isinstance(args[0], SimTensor) else guard.current()
    found: int | None = None
    for value in (*args, *kwargs.values()):
        for t in (value if isinstance(value, list | tuple) else (value,)):
            if isinstance(t, SimTensor):
                index = t.device.index
                if found is None:
                    found = index
                elif index != found:
                    raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                                       f"devices, {DEVICE_TYPE}:{found} and {DEVICE_TYPE}:{index}! ({func})")
    return guard.current() if found is None else found


_BETWEEN_DEVICES = frozenset({aten.copy_.default})
"""Ops that take tensors on two devices (a copy); the result is on the first argument's."""


def device_index(device: Any) -> int:
    """The index a tensor made for ``device`` gets: the one named, else the current device (torch_npu's rule).
    Making one initializes the device, as on torch_npu. Always 0 without the C++ guard."""
    SIM.initialized = True
    if not guard.available():
        return 0
    index = None if device is None else torch.device(device).index
    return guard.current() if index is None else index


@functools.cache
def _written(func: torch._ops.OpOverload) -> tuple[tuple[int, str], ...]:
    """(position, name) of the arguments an op writes (in-place and out= ops), read once per op."""
    return tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def _in_place_result(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any, index: int = 0) -> Any:
    """An in-place or out= op returns the tensor(s) it wrote: the caller's own wrappers, not new ones.

    An op that resized the host tensor (``resize_``, as all_gather_object calls on its byte tensor; an out=
    op under torch's "resize_output" rule) is followed by the wrapper, whose size is otherwise fixed when it is
    made: torch's CPU resize kernel sets a TensorImpl's sizes whatever its device. A host result that is not
    contiguous cannot be followed that way and is refused, naming the sizes, rather than returned with a shape
    that lies."""
    written = [args[i] if i < len(args) else kwargs.get(name) for i, name in _written(func)]
    written = [w for w in written if isinstance(w, torch.Tensor)]
    for w in written:
        if isinstance(w, SimTensor) and w.shape != w.elem.shape:
            _follow_resize(func, w)
    if isinstance(out, (tuple, list)) and len(out) == len(written):
        return type(out)(written)
    if isinstance(out, torch.Tensor) and written:
        return written[0]
    return _wrap(out, index)


def _follow_resize(func: torch._ops.OpOverload, w: SimTensor) -> None:
    before = list(w.shape)
    if w.elem.is_contiguous() and w.storage_offset() == w.elem.storage_offset():
        aten.resize_.default.redispatch(_keys("CPU"), w, w.elem.shape)
        if w.stride() == w.elem.stride():
            return
    raise RuntimeError(f"{func}: the simulated npu cannot resize an out= tensor from {before} to "
                       f"{list(w.elem.shape)} with strides {list(w.elem.stride())}; pass an out= tensor of the "
                       "result's size, or none")


def _target_is_sim(device: Any) -> bool:
    return device is not None and torch.device(device).type == DEVICE_TYPE


def _to_copy(x: torch.Tensor, *, device: Any = None, **kwargs: Any) -> torch.Tensor:
    """``.to(device)``: the target decides whether the result is wrapped (npu) or plain (cpu)."""
    source_on_sim = isinstance(x, SimTensor)
    plain = aten._to_copy.default(_unwrap(x), device=torch.device("cpu"), **kwargs)
    if _target_is_sim(device):
        return SimTensor(plain, index=device_index(device))
    if device is None and source_on_sim:
        return SimTensor(plain, index=x.device.index)
    return plain


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``dst.copy_(src)`` across the npu/cpu boundary: copy into dst's host data, return dst."""
    _unwrap(dst).copy_(_unwrap(src), non_blocking)
    return dst


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    held = _unwrap(dst)
    held.resize_(src.shape)
    held.copy_(_unwrap(src))
    return dst


def _record_stream(t: torch.Tensor, stream: Any) -> None:
    """Nothing to keep alive: work on a simulated stream has finished when it is issued (device.py)."""
    return None


_SPECIAL: Mapping[Any, Callable[..., Any]] = MappingProxyType({
    aten._to_copy.default: _to_copy,
    aten.record_stream.default: _record_stream,
    aten._copy_from.default: _copy_from,
    aten._copy_from_and_resize.default: _copy_from_and_resize,
})


class _HostAttention(torch.autograd.Function):
    """``scaled_dot_product_attention`` with the kernel torch picks for host tensors.

    torch chooses the attention kernel by device type, and the fused ones are registered from C++ for
    CPU and CUDA only (a vendor such as torch_npu registers its own); any other device gets the math
    path, whose rounding differs. Running the host tensors through the CPU's choice keeps the simulated
    NPU bit-for-bit equal to the CPU, which is the reference it is checked against.
    """

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, kwargs):
        inputs = [_unwrap(t).detach().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t
                  for t in (query, key, value, attn_mask)]
        with torch.enable_grad():
            out = torch.nn.functional.scaled_dot_product_attention(*inputs[:3], attn_mask=inputs[3], **kwargs)
        ctx.graph = (out, inputs)
        return SimTensor(out.detach(), index=query.device.index)

    @staticmethod
    def backward(ctx, grad):
        out, inputs = ctx.graph
        wanted = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
        found = torch.autograd.grad(out, [inputs[i] for i in wanted], _unwrap(grad))
        grads: list[Any] = [None] * len(inputs)
        for i, g in zip(wanted, found, strict=True):
            grads[i] = SimTensor(g, index=grad.device.index)
        return (*grads, None)


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
               enable_gqa=False):
    kwargs = {"dropout_p": dropout_p, "is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa}
    return _HostAttention.apply(query, key, value, attn_mask, kwargs)


def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return SimTensor(torch.empty(size, dtype=dtype, layout=layout, memory_format=memory_format),
                     index=device_index(device))


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return SimTensor(torch.empty_strided(size, stride, dtype=dtype, layout=layout), index=device_index(device))


def _arange(*args: Any, dtype=None, layout=None, device=None, pin_memory=None) -> torch.Tensor:
    return SimTensor(torch.arange(*args, dtype=dtype, layout=layout), index=device_index(device))


def register_allocation_kernels(lib: torch.library.Library) -> None:
    """Factories (``torch.zeros(..., device="npu")``) reach PrivateUse1 through the two allocation ops;
    attention gets the host's kernel choice."""
    lib.impl("empty.memory_format", _empty, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    # torch's arange allocates an empty tensor and lets arange.out resize it (RangeFactories.cpp), which a
    # wrapper cannot follow (_in_place_result): the host computes it and the result is wrapped.
    for overload in ("arange", "arange.start", "arange.start_step"):
        lib.impl(overload, _arange, "PrivateUse1")
    # torch.tensor(data, device="npu") fills the new tensor with Python dispatch turned off, so the copy
    # reaches the backend key rather than SimTensor.__torch_dispatch__.
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
    # Above torch's own decomposition of attention (CompositeImplicitAutograd), which would take the math
    # path on this device: see _HostAttention.
    lib.impl("scaled_dot_product_attention", _attention, "AutogradPrivateUse1")


def host(t: torch.Tensor) -> torch.Tensor:
    """The CPU tensor behind a simulated one (the same storage: writes are seen by both)."""
    if not isinstance(t, SimTensor):
        raise TypeError(f"expected a tensor on the simulated npu device, got one on {t.device}")
    return t.elem


def on_device(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """A host kernel (a C library through ctypes, a CPU function) as a kernel of the simulated device:
    simulated tensors in, their host data handed to ``kernel``, tensor results back on the device. This
    is how a vendor kernel for ``npu`` is registered and exercised without an NPU."""

    def run(*args: Any, **kwargs: Any) -> Any:
        index = next((a.device.index for a in (*args, *kwargs.values()) if isinstance(a, SimTensor)), 0)
        return _wrap(kernel(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}), index)

    return run
