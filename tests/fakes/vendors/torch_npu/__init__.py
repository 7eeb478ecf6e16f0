"""Fake torch_npu: registers an `npu` device module and an `hccl` backend the way torch_npu does.

No kernels: tensors cannot live on the fake device. What it does provide is what npudist touches
before any tensor moves: availability, device count, set_device/current_device, synchronize,
allocator statistics, and a collective backend named "hccl" registered for device type "npu"
(backed by gloo so a process group can really be created). EVENTS records the order of calls, so
tests can check that the device was selected before the process group was created.

Environment: FAKE_NPU_COUNT (default 8) devices; FAKE_NPU_UNAVAILABLE=1 makes is_available() False.
"""

from __future__ import annotations

import os
import types

import torch
import torch.distributed as dist

__version__ = "2.1.0.post3"
EVENTS: list[tuple[str, int]] = []
_current = 0


def _count() -> int:
    return int(os.environ.get("FAKE_NPU_COUNT", "8"))


def is_available() -> bool:
    return os.environ.get("FAKE_NPU_UNAVAILABLE") != "1" and _count() > 0


def device_count() -> int:
    return _count()


def set_device(index) -> None:
    global _current
    idx = index.index if isinstance(index, torch.device) else int(index)
    if not 0 <= idx < _count():
        raise RuntimeError(f"Invalid device ID {idx}")  # torch_npu raises for an out-of-range id
    _current = idx
    EVENTS.append(("set_device", idx))


def current_device() -> int:
    return _current


def synchronize(device=None) -> None:
    EVENTS.append(("synchronize", _current if device is None else int(device)))


def memory_allocated(device=None) -> int:
    return 3 * 1024 * 1024


def memory_reserved(device=None) -> int:
    return 4 * 1024 * 1024


npu = types.ModuleType("torch.npu")
for _fn in (is_available, device_count, set_device, current_device, synchronize, memory_allocated,
            memory_reserved):
    setattr(npu, _fn.__name__, _fn)

torch.utils.rename_privateuse1_backend("npu")
torch._register_device_module("npu", npu)


def _hccl(store, rank, size, timeout):
    EVENTS.append(("hccl_group_created", _current))
    return dist.ProcessGroupGloo(store, rank, size, timeout)


dist.Backend.register_backend("hccl", _hccl, devices=["npu"])
