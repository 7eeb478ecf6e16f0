"""Step-time skew across ranks: pure arithmetic over the window means the ranks exchanged."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from npudist.telemetry.exposition.catalogue import THRESHOLDS

DEFAULT_THRESHOLD = THRESHOLDS["skew"].value


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


def _known(v: float) -> float | None:
    return None if math.isnan(v) else float(v)


def _device(row: Sequence[float]) -> tuple[int, int] | None:
    if len(row) < 6 or not (math.isfinite(row[4]) and math.isfinite(row[5])):
        return None
    return int(row[4]), int(row[5])


def skew_report(first_step: int, last_step: int, rows: Sequence[Sequence[float]]) -> SkewReport:
    """Build a report from one (mean_s, temperature_c, frequency_hz[, utilization[, device_id, chip_id]]) row
    per rank; NaN = unknown."""
    if not rows:
        raise ValueError("skew needs at least one rank's window mean")
    means = tuple(float(r[0]) for r in rows)
    avg = statistics.fmean(means)
    std = statistics.pstdev(means)  # exact arithmetic: equal ranks give exactly 0
    straggler = max(range(len(means)), key=lambda i: (means[i], -i))
    utils = tuple(_known(r[3]) if len(r) > 3 else None for r in rows)
    return SkewReport(first_step, last_step, means, tuple(_known(r[1]) for r in rows),
                      tuple(_known(r[2]) for r in rows), std / avg if avg > 0 else 0.0, straggler, utils,
                      tuple(_device(r) for r in rows))


def describe(report: SkewReport, threshold: float) -> str:
    """The warning line: which rank is slow, by how much, and how hot and fast its device runs."""
    r = report.straggler
    temp, freq = report.temperatures[r], report.frequencies[r]
    avg = sum(report.means) / len(report.means)
    device = report.devices[r] if r < len(report.devices) else None
    where = "" if device is None else f" (device {device[0]} chip {device[1]})"
    return (f"step time skew {report.skew:.3f} > {threshold:g} over steps "
            f"{report.first_step}-{report.last_step}: "
            f"rank {r}{where} is slowest at {report.means[r]:.4f} s/step (mean over ranks {avg:.4f} s); "
            f"its device temperature {'n/a' if temp is None else f'{temp:.1f} C'}, "
            f"frequency {'n/a' if freq is None else f'{freq / 1e6:.0f} MHz'}")
