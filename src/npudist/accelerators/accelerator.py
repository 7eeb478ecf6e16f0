"""Uniform device calls over one vendor row, delegating to what torch already dispatches."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from npudist.accelerators.host_event import HostEvent
from npudist.accelerators.vendors import Vendor
from npudist.runtime import compat


@dataclass(frozen=True)
class Accelerator:
    """One detected accelerator family; cheap to create, touches no device until asked."""

    vendor: Vendor

    @property
    def name(self) -> str:
        return self.vendor.name

    @property
    def device_type(self) -> str:
        return self.vendor.device_type

    @property
    def stage_through_cpu(self) -> bool:
        return self.vendor.stage_through_cpu

    @property
    def backend(self) -> str:
        """Collective backend: torch's device->backend map once the vendor package registered it."""
        if self.vendor.stage_through_cpu:
            return self.vendor.backend
        import torch.distributed as dist

        registered = getattr(dist.Backend, "default_device_backend_map", {})
        return registered.get(self.device_type, self.vendor.backend)

    def _module(self) -> ModuleType:
        """torch.cuda, torch.npu (added by torch_npu), torch.mlu: the per-vendor module torch dispatches to.

        Preferred over torch.accelerator because every vendor documents it for every torch >= 2.1,
        while torch.accelerator exists only from 2.6 and needs the vendor's C++ hooks. A vendor that
        registers only with torch.accelerator still works through the fallback.
        """
        mod = getattr(torch, self.device_type, None)
        if mod is not None:
            return mod
        acc = getattr(torch, "accelerator", None)
        if acc is not None and acc.current_accelerator() is not None:
            return _AcceleratorModule(acc)
        raise RuntimeError(f"torch has neither torch.{self.device_type} nor torch.accelerator for it")

    def device_count(self) -> int:
        if self.device_type == "cpu":
            return 1
        return int(self._module().device_count())

    def device_index(self, local_rank: int, local_world_size: int) -> int:
        """The device index of a local rank: the local rank when the process sees every device of its
        node, 0 when it sees one (a visible-devices variable set per rank, e.g.
        ``ASCEND_RT_VISIBLE_DEVICES=<local rank>``). Anything else is
        ambiguous and refused (ValueError naming the count)."""
        if self.device_type == "cpu":
            return 0
        count = self.device_count()
        if local_rank < count:
            return local_rank
        if count == 1:
            return 0
        raise ValueError(
            f"local rank {local_rank} has no {self.name} device: this process sees {count} of them. Start at "
            f"most {count} ranks per node (--nproc-per-node), or give each rank one device through "
            f"{self.vendor.visible_devices_var or 'the visible-devices variable'}."
        )

    def set_device(self, index: int) -> None:
        if self.device_type == "cpu":
            return
        self._module().set_device(index)

    def device(self, index: int | None = None) -> torch.device:
        if self.device_type == "cpu":
            return torch.device("cpu")
        if index is None:
            index = int(self._module().current_device())
        return torch.device(self.device_type, index)

    def synchronize(self, index: int | None = None) -> None:
        if self.device_type == "cpu":
            return
        self._module().synchronize(index)

    # The allocator counters a script reads as torch.cuda.<name>(device): bytes of accelerator memory, so 0 where
    # there is no accelerator (CPU, RK3588's gloo row), never the host's memory.
    def memory_allocated(self, device: int | torch.device | None = None) -> int:
        return self._allocator("memory_allocated", device)

    def max_memory_allocated(self, device: int | torch.device | None = None) -> int:
        return self._allocator("max_memory_allocated", device)

    def memory_reserved(self, device: int | torch.device | None = None) -> int:
        return self._allocator("memory_reserved", device)

    def max_memory_reserved(self, device: int | torch.device | None = None) -> int:
        return self._allocator("max_memory_reserved", device)

    def reset_peak_memory_stats(self, device: int | torch.device | None = None) -> None:
        if self.device_type != "cpu":
            self._allocator_call("reset_peak_memory_stats")(_index(device))

    def empty_cache(self) -> None:
        if self.device_type != "cpu":
            self._allocator_call("empty_cache")()

    def event(self, enable_timing: bool = False, **kwargs: bool) -> Any:
        """The vendor's event (torch.cuda/npu/mlu.Event): ``record()``, ``synchronize()``,
        ``elapsed_time(end)`` in milliseconds. On CPU a host-clock event, exact because CPU ops run when
        issued (torch.Event refuses the CPU: "cpu backend doesn't support events")."""
        if self.device_type == "cpu":
            return HostEvent(enable_timing)
        make = getattr(self._module(), "Event", None)
        if make is None:
            raise RuntimeError(f"torch.{self.device_type} has no Event: time with time.perf_counter() around "
                               "npudist.accelerator().synchronize()")
        return make(enable_timing=enable_timing, **kwargs)

    # What a script asks torch.cuda about its device (npudist migrate rewrites those calls to these): the vendor
    # module's answer (torch_npu and torch_mlu keep torch.cuda's names and fields), the host's on CPU.
    def device_name(self, device: int | torch.device | None = None) -> str:
        if self.device_type == "cpu":
            return HostProperties.read().name
        return str(self._query("get_device_name")(_index(device)))

    def device_properties(self, device: int | torch.device | None = None) -> Any:
        """``name``, ``total_memory`` (bytes), ``major``, ``minor``, ``multi_processor_count`` on every vendor."""
        if self.device_type == "cpu":
            return HostProperties.read()
        return self._query("get_device_properties")(_index(device) or 0)

    def mem_get_info(self, device: int | torch.device | None = None) -> tuple[int, int]:
        """(free, total) bytes of the device's memory; of host memory on CPU."""
        if self.device_type == "cpu":
            import psutil

            memory = psutil.virtual_memory()
            return int(memory.available), int(memory.total)
        free, total = self._query("mem_get_info")(_index(device))
        return int(free), int(total)

    def _query(self, name: str) -> Any:
        call = getattr(self._module(), name, None)
        if call is None:
            raise RuntimeError(f"{self.name}: torch.{self.device_type} has no {name}() on torch {torch.__version__}")
        return call

    def _allocator(self, name: str, device: int | torch.device | None) -> int:
        if self.device_type == "cpu":
            return 0
        return int(self._allocator_call(name)(_index(device)))

    def _allocator_call(self, name: str) -> Any:
        call = getattr(self._module(), name, None)
        if call is None:
            raise RuntimeError(f"{self.name}: torch.{self.device_type} has no {name}() on torch {torch.__version__}"
                               f"; read npudist.accelerator().memory_stats() instead")
        return call

    def memory_stats(self, index: int | None = None) -> dict[str, int]:
        """Allocator bytes ``{"allocated_bytes", "reserved_bytes"}``; empty where the vendor has none."""
        if self.device_type == "cpu":
            return {}
        mod = self._module()
        if not (hasattr(mod, "memory_allocated") and hasattr(mod, "memory_reserved")):
            return {}
        return {
            "allocated_bytes": int(mod.memory_allocated(index)),
            "reserved_bytes": int(mod.memory_reserved(index)),
        }


@dataclass(frozen=True)
class HostProperties:
    """The host as a device, in the fields of torch.cuda's device properties that scripts read."""

    name: str
    total_memory: int
    multi_processor_count: int
    major: int = 0
    minor: int = 0

    @classmethod
    def read(cls) -> HostProperties:
        import os
        import platform

        import psutil

        return cls(name=platform.processor() or platform.machine() or "cpu",
                   total_memory=int(psutil.virtual_memory().total), multi_processor_count=os.cpu_count() or 1)


def _index(device: int | torch.device | None) -> int | None:
    """torch.cuda's allocator calls take an index or a device; the vendor modules agree on an index."""
    return device.index if isinstance(device, torch.device) else device


class _AcceleratorModule:
    """torch.accelerator (torch >= 2.6) under the names of a vendor device module."""

    def __init__(self, acc: ModuleType) -> None:
        self._acc = acc

    def device_count(self) -> int:
        return self._acc.device_count()

    def set_device(self, index: int) -> None:
        self._acc.set_device_index(index)

    def current_device(self) -> int:
        return self._acc.current_device_index()

    def synchronize(self, index: int | None = None) -> None:
        self._acc.synchronize(index)

    def __getattr__(self, name: str) -> Any:
        # torch.accelerator's allocator counters (memory_allocated ... empty_cache), where this torch has them
        if name in _ALLOCATOR_CALLS and compat.has("accelerator_memory"):
            return getattr(self._acc, name)
        raise AttributeError(name)


_ALLOCATOR_CALLS = frozenset({"memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                              "reset_peak_memory_stats", "empty_cache"})
