"""The framework allocator's view of device memory: allocated vs reserved (cached) bytes.

Input is ``Accelerator.memory_stats()`` (``{"allocated_bytes", "reserved_bytes"}``, empty where the
vendor has no allocator stats). Fragmentation is the reserved memory no tensor uses:
1 - allocated/reserved. Read at scrape time: memory_allocated() is a counter kept by the allocator,
cheap and non-blocking on CUDA and Ascend.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric

from npudist.telemetry.exposition.catalogue import family, rank_label_values
from npudist.telemetry.exposition.collector_health import CollectorHealth

NAME = "allocator"


@dataclass(frozen=True)
class AllocatorReading:
    allocated_bytes: int
    reserved_bytes: int
    fragmentation_ratio: float | None
    """None when nothing is reserved (no ratio exists), never 0."""


def fragmentation(allocated: int, reserved: int) -> float | None:
    """1 - allocated/reserved; None when nothing is reserved (no sample, rather than a made-up 0)."""
    if reserved <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - allocated / reserved))


def allocator_reading(stats: Mapping[str, Any]) -> AllocatorReading | None:
    """From memory_stats(); None when the stats are absent or inconsistent (allocated > reserved)."""
    allocated, reserved = stats.get("allocated_bytes"), stats.get("reserved_bytes")
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (allocated, reserved)):
        return None
    if allocated > reserved:
        return None
    return AllocatorReading(allocated, reserved, fragmentation(allocated, reserved))


def read_allocator(accelerator: Any, index: int | None = None) -> AllocatorReading | None:
    """Allocator reading for one device of an ``npudist.Accelerator``; None where it keeps no stats."""
    try:
        stats = accelerator.memory_stats(index)
    except Exception:  # a device call failing must not take the poller down
        return None
    return allocator_reading(stats)


class AllocatorCollector:
    """``stats()`` returns ``{"allocated_bytes", "reserved_bytes"}`` (Accelerator.memory_stats), empty
    where the device has no caching allocator (CPU): then no samples."""

    def __init__(self, stats: Callable[[], Mapping[str, int]], health: CollectorHealth,
                 rank_labels: Sequence[str]) -> None:
        self.stats, self.health, self.labels = stats, health, rank_label_values(rank_labels)

    def collect(self) -> Iterator[Metric]:
        allocated_f = family("npudist_allocator_allocated_bytes")
        reserved_f = family("npudist_allocator_reserved_bytes")
        frag_f = family("npudist_allocator_fragmentation_ratio")
        began = time.monotonic()
        try:
            stats = self.stats()
        except Exception:
            self.health.error(NAME, "error", time.monotonic() - began)
        else:
            reading = allocator_reading(stats) if stats else None
            if stats and reading is None:
                self.health.error(NAME, "parse", time.monotonic() - began)  # inconsistent numbers
            else:
                if reading is not None:
                    allocated_f.add_metric(self.labels, reading.allocated_bytes)
                    reserved_f.add_metric(self.labels, reading.reserved_bytes)
                    if reading.fragmentation_ratio is not None:
                        frag_f.add_metric(self.labels, reading.fragmentation_ratio)
                self.health.success(NAME, time.monotonic() - began)
        yield allocated_f
        yield reserved_f
        yield frag_f
