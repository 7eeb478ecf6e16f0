"""Caching-allocator metrics of this rank's device, read at scrape time (memory_allocated() is a
counter read in the allocator, cheap and non-blocking on CUDA and Ascend)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client.core import Metric

from npudist.telemetry.catalogue import family
from npudist.telemetry.health import CollectorHealth

NAME = "allocator"


def fragmentation(allocated: int, reserved: int) -> float | None:
    """1 - allocated/reserved; None when nothing is reserved (no sample, rather than a made-up 0)."""
    if reserved <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - allocated / reserved))


class AllocatorCollector:
    """``stats()`` returns ``{"allocated_bytes", "reserved_bytes"}`` (Accelerator.memory_stats), empty
    where the device has no caching allocator (CPU): then no samples."""

    def __init__(self, stats: Callable[[], Mapping[str, int]], health: CollectorHealth,
                 rank_labels: Sequence[str]) -> None:
        self.stats, self.health, self.labels = stats, health, list(rank_labels)

    def collect(self) -> Iterator[Metric]:
        allocated_f = family("npudist_allocator_allocated_bytes")
        reserved_f = family("npudist_allocator_reserved_bytes")
        frag_f = family("npudist_allocator_fragmentation_ratio")
        began = time.monotonic()
        try:
            stats = self.stats()
            allocated, reserved = stats.get("allocated_bytes"), stats.get("reserved_bytes")
            allocated = None if allocated is None else int(allocated)
            reserved = None if reserved is None else int(reserved)
        except Exception:
            self.health.error(NAME, "error", time.monotonic() - began)
        else:
            if allocated is not None:
                allocated_f.add_metric(self.labels, allocated)
            if reserved is not None:
                reserved_f.add_metric(self.labels, reserved)
                frag = fragmentation(allocated or 0, reserved) if allocated is not None else None
                if frag is not None:
                    frag_f.add_metric(self.labels, frag)
            self.health.success(NAME, time.monotonic() - began)
        yield allocated_f
        yield reserved_f
        yield frag_f
