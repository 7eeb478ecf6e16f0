"""The one histogram accumulator: per-bucket counts plus a sum, read as a cumulative snapshot.

The collectives' recorder, the checkpoint writer and the training-loop metrics keep their durations in
it; each exporter turns a ``Buckets`` snapshot into a fresh Prometheus family per scrape. It sits in the
ground layer because comm and checkpoint, below telemetry, fill it.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Buckets:
    pairs: tuple[tuple[float, int], ...]
    """(upper bound, cumulative count), ascending; the last bound is inf."""
    sum: float
    count: int
    """Equal to the last pair's count: derived from the buckets, so a snapshot taken mid-update agrees."""


class Histogram:
    """``observe`` is a bisect and two additions. Unshared (the default), the caller serialises observers:
    the collectives' hot path records from one thread without a lock, as torch issues a group's calls.
    ``shared=True`` takes a lock in ``observe`` for observers on several threads."""

    __slots__ = ("_lock", "bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float], *, shared: bool = False) -> None:
        bounds = tuple(float(b) for b in bounds)
        if not bounds or list(bounds) != sorted(bounds) or bounds[-1] != math.inf:
            raise ValueError(f"histogram bounds must ascend and end with inf, got {bounds}")
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self._lock = threading.Lock() if shared else None

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)  # le semantics: value == bound counts in that bucket
        if self._lock is None:
            self.counts[i] += 1
            self.sum += value
            return
        with self._lock:
            self.counts[i] += 1
            self.sum += value

    def snapshot(self) -> Buckets:
        if self._lock is None:
            counts, total = list(self.counts), self.sum
        else:
            with self._lock:
                counts, total = list(self.counts), self.sum
        pairs, running = [], 0
        for bound, n in zip(self.bounds, counts, strict=True):
            running += n
            pairs.append((bound, running))
        return Buckets(tuple(pairs), total, running)

    def clear(self) -> None:
        """Forget every observation, in place (a hot path may hold this histogram)."""
        self.counts[:] = [0] * len(self.bounds)
        self.sum = 0.0
