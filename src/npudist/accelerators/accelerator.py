"""Uniform device calls over one vendor row, delegating to what torch already dispatches."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from npudist.accelerators.vendors import Vendor


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
        # torch.cuda, torch.npu (added by torch_npu), torch.mlu, torch.cpu all share these calls.
        return getattr(torch, self.device_type)

    def _uses_torch_accelerator(self) -> bool:
        acc = getattr(torch, "accelerator", None)  # torch >= 2.6
        if acc is None or not hasattr(acc, "current_accelerator"):
            return False
        current = acc.current_accelerator()
        return current is not None and current.type == self.device_type

    def is_available(self) -> bool:
        from npudist.accelerators.detect import why_unavailable

        return why_unavailable(self.vendor) is None

    def device_count(self) -> int:
        if self.device_type == "cpu":
            return 1
        if self._uses_torch_accelerator():
            return int(torch.accelerator.device_count())
        return int(self._module().device_count())

    def set_device(self, index: int) -> None:
        if self.device_type == "cpu":
            return
        if self._uses_torch_accelerator() and hasattr(torch.accelerator, "set_device_index"):
            torch.accelerator.set_device_index(index)
        else:
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
        if self._uses_torch_accelerator():
            torch.accelerator.synchronize(index)
        else:
            self._module().synchronize(index)

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
