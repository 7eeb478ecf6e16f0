"""What ``from torch_npu.contrib import transfer_to_npu`` does, on the simulated NPU.

Huawei's module (Ascend/pytorch torch_npu/contrib/transfer_to_npu.py, ``_init``) ports a CUDA script by
patching torch at import: ``torch.cuda`` answers with ``torch.npu``'s functions, ``torch.cuda.amp`` with
torch_npu's AMP, ``.cuda()`` is ``.npu()``, a "cuda" device (string, ``torch.device``, or a bare index for
``.to``) given to the listed factories and methods becomes "npu", ``init_process_group``'s nccl becomes hccl,
``torch.jit.script`` is switched off, and NCCL leaves the default device-backend map. This module applies the
same list, written here, to the simulated NPU; what it leaves out is in docs/guide/simulated-npu.md (its profiler,
NPUGraph, ``torch.Generator``/``torch.Event`` proxies, the Triton and inductor patches).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._device

from npudist.sim.device import SIMULATED
from npudist.sim.names import TORCH_NPU_NAMES, NotSimulated
from npudist.sim.state import SIM
from npudist.sim.tensor import DEVICE_TYPE

# The lists of Huawei's module (torch_fn_white_list, torch_tensor_fn_white_list, torch_module_fn_white_list,
# torch_cuda_fn_white_list, device_kwargs_list); a name this torch lacks is skipped.
TORCH_FUNCTIONS = (
    "logspace", "randint", "hann_window", "rand", "full_like", "ones_like", "rand_like", "randperm", "arange",
    "frombuffer", "normal", "_empty_per_channel_affine_quantized", "empty_strided", "empty_like", "scalar_tensor",
    "tril_indices", "bartlett_window", "ones", "sparse_coo_tensor", "randn", "kaiser_window", "tensor",
    "triu_indices", "as_tensor", "zeros", "randint_like", "full", "eye", "_sparse_csr_tensor_unsafe", "empty",
    "_sparse_coo_tensor_unsafe", "blackman_window", "zeros_like", "range", "sparse_csr_tensor", "randn_like",
    "from_file", "_cudnn_init_dropout_state", "_empty_affine_quantized", "linspace", "hamming_window",
    "empty_quantized", "_pin_memory", "load", "set_default_device", "get_device_module", "sparse_compressed_tensor",
)
TENSOR_METHODS = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros", "to",
                  "pin_memory")
MODULE_METHODS = ("to", "to_empty")
CUDA_FUNCTIONS = (
    "get_device_properties", "get_device_name", "get_device_capability", "list_gpu_processes", "set_device",
    "synchronize", "mem_get_info", "memory_stats", "memory_summary", "memory_allocated", "max_memory_allocated",
    "reset_max_memory_allocated", "memory_reserved", "max_memory_reserved", "reset_max_memory_cached",
    "reset_peak_memory_stats", "default_stream", "can_device_access_peer", "current_stream", "utilization",
    "set_per_process_memory_fraction", "caching_allocator_alloc",
)
DEVICE_KEYWORDS = ("device", "device_type", "map_location", "device_id")
INDEX_IS_DEVICE = frozenset({"to", "to_empty"})
"""Methods where a bare int is a device index (``.to(0)``), mapped to ``npu:<int>`` as Huawei's does."""


def to_npu(value: Any, *, index_is_device: bool = False) -> Any:
    """One argument with "cuda" in it, as the same thing on "npu"; anything else unchanged."""
    if isinstance(value, str) and "cuda" in value:
        return value.replace("cuda", DEVICE_TYPE)
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device(DEVICE_TYPE, value.index) if value.index is not None else torch.device(DEVICE_TYPE)
    if index_is_device and isinstance(value, int) and not isinstance(value, bool):
        return f"{DEVICE_TYPE}:{value}"
    if isinstance(value, dict):  # map_location={"cuda:0": "cuda:1"}
        return {to_npu(k): to_npu(v) for k, v in value.items()}
    return value


def on_npu(fn: Callable[..., Any], *, index_is_device: bool = False) -> Callable[..., Any]:
    """``fn`` with its device arguments (positional, the device keywords, ``device_ids``) mapped to npu."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        args = tuple(to_npu(a, index_is_device=index_is_device) for a in args)
        for key in DEVICE_KEYWORDS:
            if key in kwargs:
                kwargs[key] = to_npu(kwargs[key], index_is_device=index_is_device)
        ids = kwargs.get("device_ids")
        if isinstance(ids, list | tuple):
            kwargs["device_ids"] = type(ids)(to_npu(i) for i in ids)
        return fn(*args, **kwargs)

    call.__npudist_transfer__ = True
    return call


def _hccl(value: Any) -> Any:
    return value.replace("nccl", "hccl").replace("cuda", DEVICE_TYPE) if isinstance(value, str) else value


def on_hccl(fn: Callable[..., Any]) -> Callable[..., Any]:
    """init_process_group / a new group with "nccl" (or "cuda:nccl") asking for hccl instead."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        args = tuple(_hccl(a) for a in args)
        if "backend" in kwargs:
            kwargs["backend"] = _hccl(kwargs["backend"])
        return fn(*args, **kwargs)

    return call


def _wrap_names(owner: Any, names: tuple[str, ...] | frozenset[str]) -> None:
    for name in names:
        fn = getattr(owner, name, None)
        if fn is not None and not getattr(fn, "__npudist_transfer__", False):
            setattr(owner, name, on_npu(fn, index_is_device=name in INDEX_IS_DEVICE))


def _wrap_init(cls: type) -> None:
    if not getattr(cls.__init__, "__npudist_transfer__", False):
        cls.__init__ = on_npu(cls.__init__)


def _jit_off(obj: Any = None, *args: Any, **kwargs: Any) -> Any:
    # Huawei's transfer_to_npu switches TorchScript off the same way: the object is returned unscripted.
    return obj


def _not_simulated(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotSimulated(f"torch.npu.{name} (torch.cuda.{name} after transfer_to_npu)")

    call.__name__ = name
    return call


def _cuda_onto_npu() -> None:
    for name in SIMULATED:
        if name not in ("amp", "utils"):  # torch.cuda.amp keeps its module; its names are replaced below
            setattr(torch.cuda, name, getattr(torch.npu, name))
    # Huawei's copies every name of torch_npu.npu's __all__ onto torch.cuda; a function the simulation lacks says
    # so when called, instead of running CUDA's (classes and tensor types keep torch.cuda's, for isinstance).
    for name in sorted(TORCH_NPU_NAMES - set(SIMULATED)):
        if name[0].islower():
            setattr(torch.cuda, name, _not_simulated(name))
    _wrap_names(torch.cuda, CUDA_FUNCTIONS)
    for name in torch.npu.amp.__all__:
        setattr(torch.cuda.amp, name, getattr(torch.npu.amp, name))
    for sub in ("autocast_mode", "grad_scaler", "common"):
        setattr(torch.cuda.amp, sub, torch.npu.amp)


def _distributed() -> None:
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group = on_hccl(on_npu(dist.init_process_group))
    dist.distributed_c10d.init_process_group = dist.init_process_group
    c10d = dist.distributed_c10d
    if hasattr(c10d, "_new_group_with_tag"):  # what new_group calls; Huawei's wraps the same function
        c10d._new_group_with_tag = on_hccl(c10d._new_group_with_tag)
    dist.is_nccl_available = lambda: True  # torch_npu points it at is_hccl_available
    dist.Backend.default_device_backend_map.pop("cuda", None)
    device_mesh.init_device_mesh = on_npu(device_mesh.init_device_mesh)
    dist.init_device_mesh = device_mesh.init_device_mesh
    _wrap_init(device_mesh.DeviceMesh)
    _wrap_init(DistributedDataParallel)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - every torch npudist supports has it
        return
    _wrap_init(FullyShardedDataParallel)


def apply() -> None:
    """Patch torch as transfer_to_npu does; the simulated NPU must be installed. Applying it twice does nothing."""
    if SIM.row is None:
        raise RuntimeError("transfer_to_npu needs the simulated NPU: run under `npudist launch --simulate npu` "
                           "or with NPUDIST_SIMULATE=npu")
    if SIM.transferred:
        return
    warnings.warn("transfer_to_npu (simulated): torch.cuda.* and 'cuda' devices now mean the npu, nccl means hccl, "
                  "and torch.jit.script returns its argument unscripted", RuntimeWarning, stacklevel=3)
    _cuda_onto_npu()
    _wrap_names(torch, tuple(n for n in TORCH_FUNCTIONS if hasattr(torch, n)))
    _wrap_names(torch.Tensor, TENSOR_METHODS)
    _wrap_names(torch.nn.Module, MODULE_METHODS)
    _wrap_init(torch.amp.autocast_mode.autocast)
    _wrap_init(torch.utils._device.DeviceContext)
    torch.Tensor.cuda = torch.Tensor.npu
    torch.Tensor.is_cuda = torch.Tensor.is_npu
    torch.nn.Module.cuda = torch.nn.Module.npu
    torch.jit.script = _jit_off
    torch.jit.script_method = _jit_off
    torch._utils._get_available_device_type = lambda: DEVICE_TYPE
    _distributed()
    SIM.transferred = True
