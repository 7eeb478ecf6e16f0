"""The limits npudist applies to its metrics, written once: the alert rules, the dashboards' threshold
lines, the job's own checks (skew reference, straggler flag) and the docs' threshold table all read them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Threshold:
    """A limit on a metric that the alert rules, the dashboards, the job's own checks (skew warning,
    straggler diagnosis) and the docs all use: written here once."""

    name: str
    metric: str
    """Catalogue metric (or recording rule) compared with ``value``."""
    value: float
    for_: str
    """How long the condition must hold before the alert fires (Prometheus duration)."""
    alert: str
    why: str
    percent: bool = False
    """Shown to people as a percentage (a ratio of memory) rather than as the ratio."""

    @property
    def text(self) -> str:
        return f"{self.value * 100:g} %" if self.percent else f"{self.value:g}"

    @property
    def for_words(self) -> str:
        """``5m`` -> ``5 minutes``."""
        number, unit = self.for_[:-1], {"s": "second", "m": "minute", "h": "hour"}[self.for_[-1]]
        return f"{number} {unit}{'' if number == '1' else 's'}"


SKEW_REFERENCE = 0.12
"""The seed's stddev/mean skew limit, kept as a reference line on the skew panel and in the report. Nothing
alerts or diagnoses on it: with one slow rank among N it dilutes as 1/sqrt(N) (the StragglerDetector judges)."""

THRESHOLDS: Mapping[str, Threshold] = MappingProxyType({t.name: t for t in (
    # Values from the issue that specified the alerts (#3): backlog > 10 for 2 min (page) and > 8 for 5 min,
    # fragmentation 30 % for 10 min, matmul mean 800 us for 10 min. The straggler alert follows the job's
    # own detector (#20) instead of stddev/mean skew, which dilutes as 1/sqrt(N).
    Threshold("straggler", "npudist_rank_straggler", 0, "1m", "NpudistStraggler",
              "1 while the job's StragglerDetector flags the rank (its window work time against the median of "
              "the other ranks, evidence over up to 3 windows); the job logs one line and writes the straggler "
              "diagnosis"),
    Threshold("backlog_critical", "npudist_collective_inflight", 10, "2m", "NpudistCollectiveBacklogCritical",
              "collectives in flight per rank: a peer is hung or the link saturated"),
    Threshold("backlog", "npudist_collective_inflight", 8, "5m", "NpudistCollectiveBacklog",
              "collectives in flight per rank: communication falls behind compute"),
    Threshold("fragmentation", "npudist_allocator_fragmentation_ratio", 0.30, "10m", "NpudistAllocatorFragmentation",
              "share of the allocator's reserved memory holding no tensor", percent=True),
    Threshold("matmul_seconds", "npudist:op_duration_seconds:mean", 0.0008, "10m", "NpudistSlowMatmul",
              "mean matmul self time in the profiled steps, seconds"),
)})


def thresholds_table(rows: Iterable[Threshold] = THRESHOLDS.values()) -> str:
    """The docs/guide/observing.md threshold table, generated so it cannot drift from the rules and the job's checks."""
    lines = ["| threshold | metric | above | for | alert | meaning |", "|---|---|---|---|---|---|"]
    for t in rows:
        lines.append(f"| `{t.name}` | `{t.metric}` | {t.text} | {t.for_} | {t.alert} | {t.why} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - `python -m npudist.telemetry.exposition.thresholds`
    print(thresholds_table(), end="")
