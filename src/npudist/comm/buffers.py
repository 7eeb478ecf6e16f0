"""Reusable, aligned flat buffers for adapted collectives.

A cast, pad or staging copy needs a scratch buffer on every call; allocating it each time costs
page faults (glibc hands out blocks above 32 MiB with a fresh mmap) and device allocator churn. The
pool keeps released buffers and hands each out to one caller at a time, so async calls in flight
never share one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_ALIGN_FLOOR = 64  # c10's CPU allocator alignment; asking for less than this costs nothing extra


def aligned_empty(numel: int, dtype: torch.dtype, device: torch.device, alignment: int = 1,
                  pin: bool = False) -> torch.Tensor:
    """A flat tensor whose data pointer is a multiple of ``alignment`` bytes."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    align = max(alignment, itemsize)
    nbytes = max(numel, 1) * itemsize
    raw = torch.empty(nbytes + align, dtype=torch.uint8, device=device, pin_memory=pin)
    offset = (-raw.data_ptr()) % align
    return raw[offset:offset + nbytes].view(dtype)[:numel]


def pinning_available(device: torch.device) -> bool:
    """Pinned host memory needs an accelerator runtime; a CPU-only torch refuses pin_memory=True."""
    if device.type == "cpu":
        return False
    try:
        torch.empty(1, pin_memory=True)
    except RuntimeError:
        return False
    return True


@dataclass
class Lease:
    """A buffer lent by the pool: ``tensor`` has the size asked for, ``whole`` the full block."""

    tensor: torch.Tensor
    whole: torch.Tensor
    key: tuple


class BufferPool:
    """Flat buffers keyed by (dtype, device, pinned, alignment), lent out exclusively."""

    def __init__(self, max_free_per_key: int = 4) -> None:
        self._free: dict[tuple, list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._max_free = max_free_per_key
        self.allocations = 0
        """How many blocks were allocated (tests check reuse with it)."""

    def acquire(self, numel: int, dtype: torch.dtype, device: torch.device, alignment: int = 1,
                pin: bool = False) -> Lease:
        """Lend a buffer of exactly ``numel`` elements, reusing the smallest free block that fits."""
        key = (dtype, device, pin, max(alignment, _ALIGN_FLOOR))
        with self._lock:
            free = self._free.get(key)
            if free:
                fits = [i for i, b in enumerate(free) if b.numel() >= numel]
                if fits:
                    whole = free.pop(min(fits, key=lambda i: free[i].numel()))
                    return Lease(whole[:numel], whole, key)
            self.allocations += 1
        whole = aligned_empty(numel, dtype, device, key[3], pin)
        return Lease(whole, whole, key)

    def release(self, lease: Lease) -> None:
        """Take a lent buffer back; the smallest blocks are dropped beyond max_free_per_key."""
        with self._lock:
            free = self._free.setdefault(lease.key, [])
            free.append(lease.whole)
            if len(free) > self._max_free:
                free.sort(key=torch.Tensor.numel)
                del free[0]

    def clear(self) -> None:
        """Drop every free block (the next acquire allocates afresh)."""
        with self._lock:
            self._free.clear()


class LayoutCache:
    """Free sets of buffers built for one layout (all_reduce_many's buckets), lent out exclusively.

    At most ``max_layouts`` layouts are kept, least recently used dropped first; ``builds`` counts the
    sets built (tests and the benchmark check reuse with it).
    """

    def __init__(self, max_layouts: int = 8) -> None:
        self._free: OrderedDict[tuple, list[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_layouts
        self.builds = 0

    def acquire(self, key: tuple, build: Callable[[], Any]) -> Any:
        """A free set for ``key``, or a new one from ``build()``."""
        with self._lock:
            free = self._free.get(key)
            if free:
                self._free.move_to_end(key)
                return free.pop()
            self.builds += 1
        return build()

    def release(self, key: tuple, buffers: Any) -> None:
        with self._lock:
            self._free.setdefault(key, []).append(buffers)
            self._free.move_to_end(key)
            while len(self._free) > self._max:
                self._free.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
