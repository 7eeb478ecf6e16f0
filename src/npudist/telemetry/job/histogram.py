"""A small thread-safe histogram accumulator that collectors turn into fresh families each scrape."""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence

from prometheus_client.utils import floatToGoString

STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, math.inf)
OP_BUCKETS = (1e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, math.inf)


class Histogram:
    """Per-bucket counts (not cumulative) plus sum and count; ``observe`` is a bisect and a lock."""

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(bounds) or bounds[-1] != math.inf:
            raise ValueError("histogram bounds must ascend and end with inf")
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * len(self.bounds)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)  # le semantics: value == bound counts in that bucket
        with self._lock:
            self._counts[min(i, len(self._counts) - 1)] += 1
            self._sum += value

    def buckets(self) -> tuple[list[tuple[str, float]], float, int]:
        """(cumulative ``le`` buckets as HistogramMetricFamily wants them, sum, count)."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        out, running = [], 0
        for bound, n in zip(self.bounds, counts, strict=True):
            running += n
            out.append((floatToGoString(bound), float(running)))
        return out, total, running
