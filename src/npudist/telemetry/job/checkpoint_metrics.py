"""Checkpoint metrics from ``npudist.checkpoint.stats()``: how long saves hold the training loop, how
long their writes take, bytes, the write in flight, waits and failures.

Read by attribute like the comm collector, so telemetry needs nothing from npudist.checkpoint at import.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import Metric

from npudist.telemetry.exposition.catalogue import family, rank_label_values
from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.job.comm_metrics import histogram_buckets

NAME = "checkpoint"


class CheckpointCollector:
    def __init__(self, health: CollectorHealth, rank_labels: Sequence[str],
                 stats: Callable[[], Any] | None = None) -> None:
        self.health, self.labels = health, rank_label_values(rank_labels)  # "source" is appended after them
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        began = time.monotonic()
        try:
            stats_fn = self._stats or importlib.import_module("npudist.checkpoint").stats
            s = stats_fn()
            histograms = [(histogram_buckets(d.buckets), float(d.sum_seconds)) for d in (s.snapshot, s.write)]
            counts = (int(s.bytes), int(s.inflight), int(s.waits), int(s.failures))
            peer = getattr(s, "peer", None)
            peer_values = None if peer is None else (
                (int(peer.age_steps), int(peer.every), int(peer.bytes), float(peer.blocking_seconds),
                 int(peer.failures)),
                {str(k): int(v) for k, v in peer.recoveries.items()})
        except Exception:
            self.health.error(NAME, "error", time.monotonic() - began)
            return
        self.health.success(NAME, time.monotonic() - began)
        names = ("npudist_checkpoint_snapshot_duration_seconds", "npudist_checkpoint_write_duration_seconds")
        for name, (buckets, total) in zip(names, histograms, strict=True):
            fam = family(name)
            fam.add_metric(self.labels, buckets, total)
            yield fam
        for name, value in zip(("npudist_checkpoint_bytes_total", "npudist_checkpoint_inflight",
                                "npudist_checkpoint_waits_total", "npudist_checkpoint_failures_total"),
                               counts, strict=True):
            fam = family(name)
            fam.add_metric(self.labels, value)
            yield fam
        if peer_values is None:
            return
        for name, value in zip(("npudist_peer_snapshot_age_steps", "npudist_peer_snapshot_interval_steps",
                                "npudist_peer_snapshot_bytes", "npudist_peer_snapshot_blocking_seconds_total",
                                "npudist_peer_snapshot_failures_total"),
                               peer_values[0], strict=True):
            fam = family(name)
            fam.add_metric(self.labels, value)
            yield fam
        fam = family("npudist_recoveries_total")
        for source, n in peer_values[1].items():
            fam.add_metric([*self.labels, source], n)
        yield fam
