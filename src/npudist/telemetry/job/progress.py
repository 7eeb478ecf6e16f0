"""Loss and throughput as metrics: what the training loop already computes, set by one call.

    telemetry = npudist.telemetry.serve_rank_metrics(ctx)
    telemetry.training_progress(loss=float(loss), samples_per_second=rate)   # whenever the loop logs

The values are the loop's own (the last logged loss, its samples/s over the logging window); a series
appears once the loop first reports, so a job that never calls it exports nothing rather than zeros.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.core import Metric

from npudist.telemetry.exposition.catalogue import family

log = logging.getLogger("npudist.telemetry")

MAX_SCALARS = 32
"""Names of npudist.log values one rank exports (the run log keeps up to runlog_schema.MAX_NAMES)."""


class ProgressMetrics:
    """A collector holding the latest values the loop reported (thread-safe: the scrape runs elsewhere)."""

    def __init__(self, rank_labels: Sequence[str]) -> None:
        self.labels = list(rank_labels)
        self._lock = threading.Lock()
        self._loss: float | None = None
        self._rate: float | None = None
        self._scalars: dict[str, float] = {}
        self._dropped: set[str] = set()

    def report(self, *, loss: float | None = None, samples_per_second: float | None = None) -> None:
        """Record the loop's latest loss and throughput; None leaves a value as it was."""
        for name, value in (("loss", loss), ("samples_per_second", samples_per_second)):
            if value is not None and not math.isfinite(float(value)):
                raise ValueError(f"training_progress: {name}={value!r} is not a finite number")
        with self._lock:
            if loss is not None:
                self._loss = float(loss)
            if samples_per_second is not None:
                self._rate = float(samples_per_second)

    def report_scalars(self, values: Mapping[str, float | None]) -> None:
        """The script's own numbers (npudist.log) as npudist_training_scalar{name=...}: a non-finite or
        missing value leaves the name's last one; past MAX_SCALARS names, new names are dropped (with one
        warning each) so a script logging a name per step cannot grow the series without bound."""
        with self._lock:
            for name, value in values.items():
                if value is None or not math.isfinite(value):
                    continue
                if name not in self._scalars and len(self._scalars) >= MAX_SCALARS:
                    if name not in self._dropped and len(self._dropped) < MAX_SCALARS:
                        self._dropped.add(name)
                        log.warning("npudist.log: %r not exported: this rank already exports %d names "
                                    "(npudist_training_scalar); it is still in the run log", name, MAX_SCALARS)
                    continue
                self._scalars[name] = float(value)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            loss, rate, scalars = self._loss, self._rate, sorted(self._scalars.items())
        fam = family("npudist_training_scalar")
        for name, value in scalars:
            fam.add_metric([*self.labels, name], value)
        yield fam
        for name, value in (("npudist_training_loss", loss), ("npudist_training_samples_per_second", rate)):
            fam = family(name)
            if value is not None:
                fam.add_metric(self.labels, value)
            yield fam
