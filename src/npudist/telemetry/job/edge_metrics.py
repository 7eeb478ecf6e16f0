"""Edge inference metrics from an ``npudist.infer.EnsembleServer``'s stats: this rank's member latency
histogram, its failures, and the runtime and NPU core mask it runs with; on a fan-out front, also the
members it has, those answering and the degraded answers.

Read by attribute like the checkpoint collector, so telemetry imports nothing from npudist.infer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import Metric

from npudist.telemetry.exposition.catalogue import family, rank_label_values
from npudist.telemetry.exposition.collector_health import CollectorHealth

NAME = "edge"


class EdgeCollector:
    """``stats`` returns the server's EnsembleStats (``inference`` histogram, ``member_failures``,
    ``runtime``, ``core_mask``); register it on the rank's registry (RankTelemetry.registry)."""

    def __init__(self, health: CollectorHealth, rank_labels: Sequence[str], stats: Callable[[], Any]) -> None:
        self.health, self.labels, self._stats = health, rank_label_values(rank_labels), stats

    def collect(self) -> Iterator[Metric]:
        began = time.monotonic()
        try:
            s = self._stats()
            buckets, total, _ = s.inference.buckets()
            labels = [*self.labels, str(s.runtime), str(s.core_mask)]
            failures = int(s.member_failures)
            members = (int(s.members_expected), int(s.members_answering), int(s.degraded))
        except Exception:
            self.health.error(NAME, "error", time.monotonic() - began)
            return
        self.health.success(NAME, time.monotonic() - began)
        fam = family("npudist_edge_inference_duration_seconds")
        fam.add_metric(labels, buckets, total)
        yield fam
        fam = family("npudist_edge_inference_failures_total")
        fam.add_metric(labels, failures)
        yield fam
        fam = family("npudist_edge_runtime_info")
        fam.add_metric(labels, 1)
        yield fam
        if members[0]:  # only a fan-out front knows the ensemble's members
            for name, value in zip(("npudist_edge_members_expected", "npudist_edge_members_answering",
                                    "npudist_edge_degraded_answers_total"), members, strict=True):
                fam = family(name)
                fam.add_metric(self.labels, value)
                yield fam
