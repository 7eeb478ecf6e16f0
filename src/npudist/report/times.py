"""Times as the report shows them: a UTC date, a span, a run's running time over its segments.

Pure. Records arrive checked (finite float64), but sums and differences of finite values can still overflow,
and a hostile record may carry a time no calendar holds: each says so instead of failing.
"""

from __future__ import annotations

import math
import time
from typing import Any


def finite(value: Any) -> bool:
    """A plottable number. Records arrive checked (finite float64), but sums and differences of finite
    values can still overflow to inf, so every derived value is checked again before it is shown."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past float64's range
        return False


def utc_time(t: float) -> str:
    """``t`` (seconds since the epoch) as a UTC date and time, or a note when no calendar holds it."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    except (OverflowError, OSError, ValueError):  # a time no calendar holds (hostile or corrupt record)
        return "not recorded (record time out of range)"


def _span(seconds: float) -> str:
    if not finite(seconds) or seconds > 1e12:
        return "not recorded (record times out of range)"
    s = round(seconds)
    return f"{s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


def _running_seconds(records: list[dict[str, Any]]) -> tuple[float, int]:
    """The time the job ran and in how many segments: the sum of its segments (a start record to that rank's
    last record before the next start) on the lowest rank that logged one, so the hours between a crash and
    its resume don't count."""
    starts = [r["rank"] for r in records if r["kind"] == "start"]
    rank = min(starts) if starts else min(r["rank"] for r in records)
    total, first, last, segments = 0.0, None, None, 0
    for r in sorted((r for r in records if r["rank"] == rank), key=lambda r: r["time"]):
        if r["kind"] == "start" and first is not None:
            total += last - first
            first = None
        if first is None:
            first, segments = r["time"], segments + 1
        last = r["time"]
    return total + (last - first if first is not None else 0.0), segments


def duration_text(records: list[dict[str, Any]]) -> str:
    """The running time; for a resumed run also that it is a sum, beside the span from start to end, so it
    is not read as "ended - started" (the card shows both times just above)."""
    running, segments = _running_seconds(records)
    if segments < 2:
        return _span(running)
    times = [r["time"] for r in records]
    return (f"{_span(running)} running, summed over {segments} segments (the pauses before resumes left out; "
            f"{_span(max(times) - min(times))} from started to ended)")
