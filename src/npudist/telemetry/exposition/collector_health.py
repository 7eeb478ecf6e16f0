"""Self-monitoring shared by every collector: errors by reason, last success, last read duration.

Collectors and pollers report here instead of raising, so a broken source shows up as
``npudist_collector_errors_total{collector,reason}`` while the scrape carries on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client.core import Metric

from npudist.telemetry.exposition.catalogue import family


class CollectorHealth:
    """Thread-safe counters written by pollers/collectors and exported by ``collect()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: dict[tuple[str, str], int] = {}
        self._last_success: dict[str, float] = {}
        self._duration: dict[str, float] = {}

    def success(self, collector: str, duration_s: float, when: float | None = None) -> None:
        with self._lock:
            self._last_success[collector] = time.time() if when is None else when
            self._duration[collector] = duration_s

    def error(self, collector: str, reason: str, duration_s: float | None = None) -> None:
        with self._lock:
            key = (collector, reason)
            self._errors[key] = self._errors.get(key, 0) + 1
            if duration_s is not None:
                self._duration[collector] = duration_s

    def errors(self, collector: str) -> dict[str, int]:
        """Error counts by reason for one collector (for tests and logs)."""
        with self._lock:
            return {r: n for (c, r), n in self._errors.items() if c == collector}

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            errors, last, duration = dict(self._errors), dict(self._last_success), dict(self._duration)
        fam = family("npudist_collector_errors_total")
        for (collector, reason), n in sorted(errors.items()):
            fam.add_metric([collector, reason], n)
        yield fam
        fam = family("npudist_collector_last_success_timestamp_seconds")
        for collector, ts in sorted(last.items()):
            fam.add_metric([collector], ts)
        yield fam
        fam = family("npudist_collector_duration_seconds")
        for collector, d in sorted(duration.items()):
            fam.add_metric([collector], d)
        yield fam
