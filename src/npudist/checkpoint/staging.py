"""Host copies of device state for asynchronous checkpoints, into buffers kept from one save to the next.

A save's device tensors are copied into host buffers allocated the first time a state of that layout
(the device tensors' shapes, dtypes and devices, in order) is staged; later saves of the same layout copy
into the same buffers. That is safe because a save starts only after the previous write ended
(CheckpointWriter.settle). Buffers are pinned where the device can pin host memory, and the copies are
issued with ``non_blocking=True`` on a side stream of the device module when it has streams, then waited
for with one event: the copy runs at the device-to-host limit instead of one synchronous copy per tensor.

torch's own DefaultStager (torch >= 2.9) is not used: a reused one fails on its second ``stage()`` on
torch 2.11.0-2.12.1 (``KeyError: <class 'type'>`` in deepcopy_with_tensor_offload), and it does not exist
on older torch that Ascend users pin.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch


def on_device(t: torch.Tensor) -> bool:
    """Whether a tensor is staged into a reused host buffer: any tensor on a device (the simulated NPU's
    included, so its runs take the path a real device takes)."""
    return t.device.type != "cpu"


class HostStaging:
    """Stages state into host buffers reused per layout; ``close()`` drops them."""

    def __init__(self, *, needs_copy: Callable[[torch.Tensor], bool] | None = None) -> None:
        self._needs_copy = needs_copy
        self._layout: tuple[tuple[Any, ...], ...] | None = None
        self._buffers: list[torch.Tensor] = []
        self.allocations = 0
        """How many times buffers were (re)allocated: once per new layout."""

    def stage(self, state: Any) -> Any:
        """A copy of ``state`` that training can no longer change: containers rebuilt, device tensors in
        the reused host buffers, host tensors cloned, everything else deep-copied."""
        device_tensors: dict[int, torch.Tensor] = {}
        _collect(state, self._needs_copy or on_device, device_tensors)
        sources = list(device_tensors.values())
        layout = tuple((tuple(t.shape), t.dtype, t.device) for t in sources)
        if layout != self._layout:
            self._buffers = [_host_buffer(t) for t in sources]
            self._layout = layout
            self.allocations += 1
        _copy_all(sources, self._buffers)
        memo: dict[int, Any] = {id(t): buf for t, buf in zip(sources, self._buffers, strict=True)}
        return _rebuild(state, memo)

    def close(self) -> None:
        self._buffers, self._layout = [], None


def copy_host(state: Any) -> Any:
    """A copy of ``state`` that has no device tensor, as ``HostStaging.stage`` makes it, without looking
    for device tensors first: what a peer snapshot copies at the call (a few leaves) costs microseconds."""
    return _rebuild(state, {})


def _collect(obj: Any, needs_copy: Callable[[torch.Tensor], bool], out: dict[int, torch.Tensor]) -> None:
    if isinstance(obj, torch.Tensor):
        if needs_copy(obj):
            out.setdefault(id(obj), obj)  # one buffer per tensor object, so aliases stay aliases
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect(v, needs_copy, out)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _collect(v, needs_copy, out)


def _pinnable(device: torch.device) -> bool:
    """Page-locked host memory exists for CUDA (and for the NPU, through torch_npu's hooks); where it
    does not (the simulated NPU, a CPU-only torch) pinning fails and a plain host buffer is used."""
    if device.type == "cuda":
        return torch.cuda.is_available()
    return device.type == "npu"


def _host_buffer(t: torch.Tensor) -> torch.Tensor:
    if _pinnable(t.device):
        try:
            return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        except RuntimeError:  # no pinned allocator for this device in this torch: a plain buffer still works
            pass
    return torch.empty(t.shape, dtype=t.dtype, device="cpu")


def _copy_all(sources: list[torch.Tensor], buffers: list[torch.Tensor]) -> None:
    """Every copy issued asynchronously on one side stream after the work already queued, then one wait."""
    by_type = {t.device.type for t in sources}
    module = getattr(torch, next(iter(by_type)), None) if len(by_type) == 1 and "cpu" not in by_type else None
    stream_cls = getattr(module, "Stream", None)
    if by_type == {"cpu"} and hasattr(torch, "_foreach_copy_"):  # torch >= 2.1: one call, not one per tensor
        torch._foreach_copy_(buffers, [src.detach() for src in sources])
        return
    if module is None or stream_cls is None or not hasattr(module, "current_stream"):
        for src, dst in zip(sources, buffers, strict=True):
            dst.copy_(src.detach())
        return
    device = sources[0].device
    side = stream_cls(device=device)
    side.wait_stream(module.current_stream(device))  # the values the caller's stream computed so far
    with module.stream(side):
        for src, dst in zip(sources, buffers, strict=True):
            dst.copy_(src.detach(), non_blocking=True)
        done = side.record_event()
    done.synchronize()


def _rebuild(obj: Any, memo: dict[int, Any]) -> Any:
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:  # host tensors: a clone (0.3 ms, where staging is 160+ ms); others: to the host
            memo[id(obj)] = obj.detach().clone() if obj.device.type == "cpu" else obj.detach().to("cpu", copy=True)
        return memo[id(obj)]
    if isinstance(obj, dict):
        out = copy.copy(obj)  # keeps the class and attributes (a state_dict's _metadata)
        for k, v in obj.items():
            out[k] = _rebuild(v, memo)
        return out
    if isinstance(obj, list):
        return [_rebuild(v, memo) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_rebuild(v, memo) for v in obj)
    return copy.deepcopy(obj)
