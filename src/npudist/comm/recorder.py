"""Per-(op, backend) accounting of collectives, read as an immutable snapshot by the exporter.

Recording a finished call is a few integer additions without a lock (collectives on one group are
issued from one thread, as in torch; in-flight counts, touched from ``wait()`` in any thread, keep the
lock). No device synchronisation, so the durations are host wall time (issue to return, or issue to
``wait()`` for async calls) unless ``NPUDIST_COMM_SYNC_TIMING=1`` asks the collectives to synchronise the
device before stopping the clock. ``set_recording(False)`` turns recording off (benchmark baseline).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from npudist.runtime.histogram import Histogram

# Seconds; the exporter turns these into the histogram of npudist_collective_duration_seconds.
DURATION_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, float("inf"))
ADAPTATION_KINDS = ("cast", "contiguous", "pad", "align", "stage")


@dataclass(frozen=True)
class OpStats:
    op: str
    """all_reduce, broadcast, all_gather, reduce_scatter, all_reduce_many."""
    backend: str
    """gloo, nccl, hccl, ..."""
    calls: int
    bytes: int
    """Payload bytes the caller passed (before adaptation)."""
    duration_sum_seconds: float
    duration_count: int
    duration_buckets: tuple[tuple[float, int], ...]
    """(upper bound in seconds, cumulative count); the last bound is inf."""
    inflight: int
    """Operations issued and not yet waited (async handles, and buckets of all_reduce_many)."""
    adaptations: dict[str, int]
    """kind -> count for every kind in ADAPTATION_KINDS (zeros included, so series stay stable)."""


@dataclass(frozen=True)
class CommStats:
    ops: tuple[OpStats, ...]

    def get(self, op: str, backend: str | None = None) -> OpStats | None:
        """The entry for ``op`` (and ``backend``, when given), or None."""
        for s in self.ops:
            if s.op == op and (backend is None or s.backend == backend):
                return s
        return None


class _Counter:
    __slots__ = ("adaptations", "bytes", "calls", "durations", "inflight")

    def __init__(self) -> None:
        self.inflight = 0
        self.durations = Histogram(DURATION_BUCKETS)
        self.clear()

    def clear(self) -> None:
        """Forget finished calls (in place: a hot path may hold this counter); in-flight ones stay."""
        self.calls = 0
        self.bytes = 0
        self.durations.clear()
        self.adaptations = dict.fromkeys(ADAPTATION_KINDS, 0)


class Recorder:
    """Thread-safe counters; the CommState's instance backs npudist.comm.stats()/reset_stats()."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # reentrant: record_shared() holds it around record()
        self._counters: dict[tuple[str, str], _Counter] = {}
        self.enabled = True
        """False: record() and inflight() do nothing (the collectives also skip timing)."""

    @property
    def lock(self) -> threading.RLock:
        """Held around every in-flight change and every record_shared()."""
        return self._lock

    def counter(self, op: str, backend: str) -> _Counter:
        """The live counter of (op, backend): a hot path may keep it, as reset() clears it in place."""
        return self._counters.get((op, backend)) or self._counter(op, backend)

    def _counter(self, op: str, backend: str) -> _Counter:
        c = self._counters.get((op, backend))
        if c is None:
            with self._lock:
                c = self._counters.get((op, backend))
                if c is None:
                    c = self._counters[(op, backend)] = _Counter()
        return c

    def record(self, op: str, backend: str, nbytes: int, seconds: float,
               kinds: tuple[str, ...] | list[str] = ()) -> None:
        """One finished call: its payload bytes, wall time and the adaptations it needed.

        On the hot path of every collective, so no lock: the histogram's snapshot derives its count from the
        buckets, which keeps a snapshot taken mid-update self-consistent.
        """
        if not self.enabled:
            return
        self.add(self._counters.get((op, backend)) or self._counter(op, backend), nbytes, seconds, kinds)

    @staticmethod
    def add(c: _Counter, nbytes: int, seconds: float, kinds: tuple[str, ...] | list[str] = ()) -> None:
        """One finished call into a counter the caller holds (from counter())."""
        c.calls += 1
        c.bytes += nbytes
        c.durations.observe(seconds)
        if kinds:
            adaptations = c.adaptations
            for kind in kinds:
                adaptations[kind] += 1

    def record_shared(self, op: str, backend: str, nbytes: int, seconds: float,
                      kinds: tuple[str, ...] | list[str] = ()) -> None:
        """record() from a backend thread (a future's callback), where two completions can run at once."""
        with self._lock:
            self.record(op, backend, nbytes, seconds, kinds)

    def inflight(self, op: str, backend: str, delta: int) -> None:
        if not self.enabled:
            return
        c = self._counter(op, backend)
        with self._lock:
            c.inflight += delta

    def snapshot(self) -> CommStats:
        with self._lock:
            items = sorted(self._counters.items())
            out = []
            for (op, backend), c in items:
                durations = c.durations.snapshot()
                if not (c.calls or c.inflight or durations.count):
                    continue  # nothing since the last reset()
                out.append(OpStats(op=op, backend=backend, calls=c.calls, bytes=c.bytes,
                                   duration_sum_seconds=durations.sum, duration_count=durations.count,
                                   duration_buckets=durations.pairs, inflight=c.inflight,
                                   adaptations=dict(c.adaptations)))
        return CommStats(ops=tuple(out))

    def reset(self) -> None:
        """Forget finished calls; in-flight counts survive so a later wait() cannot go negative."""
        with self._lock:
            for c in self._counters.values():
                c.clear()
