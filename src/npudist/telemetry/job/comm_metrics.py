"""Collective metrics from ``npudist.comm.stats()``, imported lazily: without npudist.comm, no metrics.

The snapshot (CommStats of OpStats) is defined by npudist.comm; this module reads it by attribute so
it needs nothing from that package at import time. Buckets arrive cumulative, last bound inf.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

from npudist.telemetry.exposition.catalogue import family, rank_label_values
from npudist.telemetry.exposition.collector_health import CollectorHealth

NAME = "comm"


def comm_stats_function(name: str = "stats") -> Callable[[], Any] | None:
    """``npudist.comm.<name>`` (default ``stats``) when that package is present, else None."""
    try:
        module = importlib.import_module("npudist.comm")
    except ModuleNotFoundError as exc:
        if exc.name in ("npudist.comm", "npudist"):
            return None
        raise
    return getattr(module, name, None)


def histogram_buckets(pairs: Sequence[tuple[float, int]]) -> list[tuple[str, float]]:
    """OpStats.duration_buckets as ``le`` buckets; ValueError unless cumulative and ending at inf."""
    if not pairs or not math.isinf(pairs[-1][0]):
        raise ValueError("duration buckets must end with an inf bound")
    out, last_bound, last_count = [], -math.inf, 0
    for bound, count in pairs:
        if not bound > last_bound or count < last_count:
            raise ValueError("duration buckets must have ascending bounds and cumulative counts")
        out.append((floatToGoString(bound), float(count)))
        last_bound, last_count = bound, count
    return out


class CommCollector:
    def __init__(self, health: CollectorHealth, rank_labels: Sequence[str],
                 stats: Callable[[], Any] | None = None, stall: Callable[[], float | None] | None = None,
                 store_rtt: Callable[[], float | None] | None = None) -> None:
        self.health, self.labels = health, rank_label_values(rank_labels)
        self._stats = stats
        self._resolved = stats is not None
        self._stall = stall
        self._store_rtt = store_rtt

    def _stats_function(self) -> Callable[[], Any] | None:
        if not self._resolved:
            self._resolved = True
            try:
                self._stats = comm_stats_function()
            except Exception:
                self.health.error(NAME, "missing")
        return self._stats

    def collect(self) -> Iterator[Metric]:
        stats_fn = self._stats_function()
        if stats_fn is None:
            return
        calls, nbytes = family("npudist_collective_calls_total"), family("npudist_collective_bytes_total")
        duration = family("npudist_collective_duration_seconds")
        inflight = family("npudist_collective_inflight")
        adaptations = family("npudist_collective_adaptations_total")
        began = time.monotonic()
        try:
            ops = tuple(stats_fn().ops)
        except Exception:
            self.health.error(NAME, "error", time.monotonic() - began)
            ops = ()
        else:
            self.health.success(NAME, time.monotonic() - began)
        for op in ops:
            try:
                labels = [*self.labels, str(op.op), str(op.backend)]
                buckets = histogram_buckets(op.duration_buckets)
                if buckets[-1][1] != int(op.duration_count):
                    raise ValueError("the inf bucket must equal duration_count")
                kinds = sorted((str(k), int(n)) for k, n in op.adaptations.items())
                row = (int(op.calls), int(op.bytes), float(op.duration_sum_seconds), int(op.inflight))
            except (TypeError, ValueError, AttributeError):
                self.health.error(NAME, "parse")
                continue
            calls.add_metric(labels, row[0])
            nbytes.add_metric(labels, row[1])
            duration.add_metric(labels, buckets, row[2])
            inflight.add_metric(labels, row[3])
            for kind, n in kinds:
                adaptations.add_metric([*labels, kind], n)
        yield from (calls, nbytes, duration, inflight, adaptations)
        yield from self._stall_family()

    def _stall_family(self) -> Iterator[Metric]:
        yield from self._seconds("npudist_hang_stall_seconds", self._stall, "hang_stall_seconds")
        yield from self._seconds("npudist_rank_store_rtt_seconds", self._store_rtt, "store_rtt_seconds")

    def _seconds(self, name: str, given: Callable[[], float | None] | None, function: str) -> Iterator[Metric]:
        """One gauge of seconds from ``given`` (else npudist.comm's ``function``); nothing while it has none."""
        fn = given if given is not None else comm_stats_function(function)
        try:
            seconds = fn() if fn is not None else None
        except Exception:
            self.health.error(NAME, "error")
            return
        if isinstance(seconds, int | float) and math.isfinite(seconds) and seconds >= 0:
            fam = family(name)
            fam.add_metric(self.labels, float(seconds))
            yield fam
