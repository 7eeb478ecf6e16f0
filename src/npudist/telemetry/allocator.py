"""The framework allocator's view of device memory: allocated vs reserved (cached) bytes.

Input is ``Accelerator.memory_stats()`` (``{"allocated_bytes", "reserved_bytes"}``, empty where the
vendor has no allocator stats). Fragmentation is the reserved memory no tensor uses:
1 - allocated/reserved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AllocatorReading:
    allocated_bytes: int
    reserved_bytes: int
    fragmentation_ratio: float | None
    """None when nothing is reserved (no ratio exists), never 0."""


def allocator_reading(stats: dict[str, Any]) -> AllocatorReading | None:
    """From memory_stats(); None when the stats are absent or inconsistent (allocated > reserved)."""
    allocated, reserved = stats.get("allocated_bytes"), stats.get("reserved_bytes")
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (allocated, reserved)):
        return None
    if allocated > reserved:
        return None
    frag = 1.0 - allocated / reserved if reserved else None
    return AllocatorReading(allocated, reserved, frag)


def read_allocator(accelerator: Any, index: int | None = None) -> AllocatorReading | None:
    """Allocator reading for one device of an ``npudist.Accelerator``; None where it keeps no stats."""
    try:
        stats = accelerator.memory_stats(index)
    except Exception:  # a device call failing must not take the poller down
        return None
    return allocator_reading(stats)
