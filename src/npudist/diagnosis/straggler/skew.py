"""The exchanged window: every rank's mean work time, sections and vitals; skew is pure arithmetic over it.

Skew (stddev/mean) is the seed's dashboard number; it dilutes as 1/sqrt(N) with one slow rank among N, so
alerts and the diagnosis use the per-rank verdict of npudist.diagnosis.straggler.detector, carried here as
``ratios`` and ``flagged``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SkewReport:
    first_step: int
    last_step: int
    means: tuple[float, ...]
    """Mean step time of each rank over the window, seconds, indexed by rank."""
    temperatures: tuple[float | None, ...]
    frequencies: tuple[float | None, ...]
    skew: float
    """Population standard deviation / mean of ``means`` (0 when the mean is 0)."""
    straggler: int
    """Rank with the longest mean step time (lowest rank on ties)."""
    utilizations: tuple[float | None, ...] = ()
    """Device utilization ratio of each rank, where the rows carried a fourth column."""
    devices: tuple[tuple[int, int] | None, ...] = ()
    """(device id, chip id) of each rank's physical device (npu-smi NPU ID and chip), where known."""
    data_waits: tuple[float | None, ...] = ()
    """Mean seconds per step each rank waited for its data before the forward (part of its work)."""
    comm_waits: tuple[float | None, ...] = ()
    """Mean seconds per step each rank waited in exposed communication (DDP gradient sync; not work)."""
    ratios: tuple[float | None, ...] = ()
    """Each rank's window mean over the median of the other ranks' (StragglerDetector.ratios)."""
    flagged: tuple[int, ...] = ()
    """Ranks the StragglerDetector flags at this window."""
    others: tuple[float | None, ...] = ()
    """Mean seconds per step each rank spent between its last step's end and its next batch request."""
    computes: tuple[float | None, ...] = ()
    """Mean seconds per step of each rank's compute phase (its step less data, communication and other)."""


MAX_WINDOW_MEAN_S = 1e9
"""About 31 years per step: above it a mean is corrupt, and summing two such would overflow fsum."""


def _mean(v: float) -> float:
    v = float(v)
    return v if math.isfinite(v) and 0 <= v < MAX_WINDOW_MEAN_S else math.nan


def _known(v: float) -> float | None:
    return None if math.isnan(v) else float(v)


def _device(row: Sequence[float]) -> tuple[int, int] | None:
    if len(row) < 6 or not (math.isfinite(row[4]) and math.isfinite(row[5])):
        return None
    return int(row[4]), int(row[5])


def _column(rows: Sequence[Sequence[float]], i: int) -> tuple[float | None, ...]:
    return tuple(_known(r[i]) if len(r) > i else None for r in rows)


def skew_report(first_step: int, last_step: int, rows: Sequence[Sequence[float]]) -> SkewReport:
    """Build a report from one (mean_s, temperature_c, frequency_hz[, utilization[, device_id, chip_id
    [, data_wait_s, comm_wait_s[, other_s, compute_s]]]]) row per rank; NaN = unknown."""
    if not rows:
        raise ValueError("skew needs at least one rank's window mean")
    # A mean no clock gives (NaN, inf, negative, past MAX_WINDOW_MEAN_S: a corrupt row or a broken timer on
    # one rank) is unknown: every rank runs this on the same rows, so raising would stop them all at once.
    means = tuple(_mean(r[0]) for r in rows)
    known = [m for m in means if not math.isnan(m)]
    avg = statistics.fmean(known) if known else 0.0
    std = statistics.pstdev(known) if known else 0.0  # exact arithmetic: equal ranks give exactly 0
    straggler = max(range(len(means)), key=lambda i: (-math.inf if math.isnan(means[i]) else means[i], -i))
    return SkewReport(first_step, last_step, means, _column(rows, 1), _column(rows, 2),
                      std / avg if avg > 0 else 0.0, straggler, _column(rows, 3), tuple(_device(r) for r in rows),
                      _column(rows, 6), _column(rows, 7), others=_column(rows, 8), computes=_column(rows, 9))
