"""The training loop's bucket tables, and the one histogram (npudist.runtime.histogram) as collectors read it.

Observers are the step timer's hooks and the inference server's threads, so it is the shared (locked) kind.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prometheus_client.utils import floatToGoString

from npudist.runtime.histogram import Histogram as _Accumulator

STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, math.inf)
OP_BUCKETS = (1e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, math.inf)


class Histogram(_Accumulator):
    """The shared accumulator, with ``buckets()`` in the shape HistogramMetricFamily takes."""

    __slots__ = ()

    def __init__(self, bounds: Sequence[float]) -> None:
        super().__init__(bounds, shared=True)

    def buckets(self) -> tuple[list[tuple[str, float]], float, int]:
        """(cumulative ``le`` buckets as HistogramMetricFamily wants them, sum, count)."""
        snap = self.snapshot()
        return [(floatToGoString(bound), float(n)) for bound, n in snap.pairs], snap.sum, snap.count
