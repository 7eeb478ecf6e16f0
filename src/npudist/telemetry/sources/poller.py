"""Run a device source off the scrape path: a background thread with an interval and a hard timeout.

``collect()`` only ever reads the last good snapshot, so a hung, crashing or garbage-printing tool
(npu-smi stuck in the driver is a known failure) delays nothing; it is counted in CollectorHealth.
Python cannot kill a thread, so a read that outlives its timeout is abandoned: it is counted as a
timeout at every interval it is still stuck, no second read is started beside it, and whatever it
returns late is discarded as stale.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.sources.readings import DeviceReading, ParseError, Source, SourceError

log = logging.getLogger("npudist.telemetry")


@dataclass(frozen=True)
class Snapshot:
    readings: tuple[Any, ...]
    """Readings of the last successful read (empty before the first one)."""
    success_at: float | None
    """time.time() of the last successful read."""
    fresh: bool
    """The latest read succeeded and is younger than the poller's stale limit."""


class _Read:
    """One read running in its own thread; ``result`` is a list of readings or the exception raised."""

    def __init__(self, source: Source) -> None:
        self.result: object = None
        self.done = threading.Event()
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, args=(source,), name=f"npudist-read-{source.name}",
                                       daemon=True)
        self.thread.start()

    def _run(self, source: Source) -> None:
        try:
            self.result = source.read()
        except BaseException as exc:  # a source must never take the poller down, whatever it raises
            self.result = exc
        finally:
            self.done.set()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, SourceError):
        return exc.reason or "error"
    if isinstance(exc, ParseError):
        return "parse"
    return "error"


class Poller:
    """Polls one Source every ``interval_s`` seconds, each read bounded by ``timeout_s``."""

    def __init__(self, source: Source, health: CollectorHealth, *, interval_s: float = 5.0,
                 timeout_s: float | None = None, stale_after_s: float | None = None,
                 record: type = DeviceReading) -> None:
        if not interval_s > 0:
            raise ValueError(f"poll interval must be positive, got {interval_s} s")
        self.source = source
        self.record = record
        """What read() returns a list of: DeviceReading, or ChipMeasurements for the reliability sweeps."""
        self.name = getattr(source, "name", type(source).__name__)
        self.health = health
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s) if timeout_s is not None else min(self.interval_s, 10.0)
        self.stale_after_s = (stale_after_s if stale_after_s is not None
                              else 3 * self.interval_s + self.timeout_s)
        self._lock = threading.Lock()
        self._readings: tuple[Any, ...] = ()
        self._success_at: float | None = None
        self._last_ok = False
        self._pending: _Read | None = None
        self._logged: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> bool:
        """One bounded read (waits at most timeout_s); True when it produced a new snapshot."""
        read = self._pending
        if read is not None and read.done.is_set():
            read = None  # a late answer from an abandoned read: stale, start afresh
        if read is None:
            read = _Read(self.source)
        if not self._wait(read):
            self._pending = read
            if self._stop.is_set():
                return False  # stopped, not timed out: nothing to count
            self._fail("timeout", f"read still running after {time.monotonic() - read.started:.1f} s",
                       time.monotonic() - read.started)
            return False
        self._pending = None
        duration = time.monotonic() - read.started
        result = read.result
        if isinstance(result, BaseException):
            self._fail(_reason(result), f"{type(result).__name__}: {result}", duration)
            return False
        if not isinstance(result, list | tuple) or not all(isinstance(r, self.record) for r in result):
            self._fail("error", f"read() returned {type(result).__name__}, not a list of {self.record.__name__}",
                       duration)
            return False
        with self._lock:
            self._readings = tuple(result)
            self._success_at = time.time()
            self._last_ok = True
        self.health.success(self.name, duration, self._success_at)
        self._logged.clear()
        return True

    def _wait(self, read: _Read) -> bool:
        """Wait up to timeout_s for ``read``; stop() cuts the wait short (checked every 50 ms)."""
        deadline = time.monotonic() + self.timeout_s
        while not read.done.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
            if self._stop.is_set() or time.monotonic() >= deadline:
                return False
        return True

    def _fail(self, reason: str, detail: str, duration: float) -> None:
        with self._lock:
            self._last_ok = False
        self.health.error(self.name, reason, duration)
        if reason not in self._logged:  # once per failure streak and reason, not at every interval
            self._logged.add(reason)
            log.warning("telemetry source %s: %s (%s); serving the last good readings",
                        self.name, reason, detail)

    def snapshot(self) -> Snapshot:
        """The last good readings; never blocks on the source."""
        with self._lock:
            readings, success_at, ok = self._readings, self._success_at, self._last_ok
        fresh = ok and success_at is not None and time.time() - success_at <= self.stale_after_s
        return Snapshot(readings, success_at, fresh)

    def start(self) -> Poller:
        """Start the background thread (first read at once); returns self."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=f"npudist-poll-{self.name}", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.poll_once()
            except Exception as exc:  # pragma: no cover - poll_once already contains every source failure
                self.health.error(self.name, "error")
                log.exception("telemetry poller %s: %s", self.name, exc)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the polling thread and wait up to ``timeout_s`` in all for it and for a read in flight. A
        read still running after that (a vendor tool stuck in the driver) is left to its own timeout:
        Python cannot stop a thread."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        read = self._pending
        if read is not None:
            read.thread.join(max(0.0, deadline - time.monotonic()))


def finite(value: float | None) -> bool:
    """True for a number worth exporting: None and NaN mean 'not available', never 0."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))
