"""The background half of asynchronous checkpoints: one write in flight, its errors, its figures.

``save(..., async_save=True)`` takes a consistent host copy of the state in the caller, then hands the
write (file, fsync, checksum, manifest, rename) to a thread started here. At most one such write
exists: the next save first waits for it, so host copies never pile up. A write that fails is logged
at once and kept until the next save or ``shutdown()`` raises it, on every rank.

One ``CheckpointWriter`` holds all of that (thread, staging buffers (staging.py), counters; the side process group
of sharded writes is npudist.comm.control's); it is a part of the process's Runtime (``writer()``),
whose close (``shutdown()``, or the exit hook of a run that skips it) waits for the last write first.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npudist.checkpoint.staging import HostStaging
from npudist.runtime.histogram import Histogram
from npudist.runtime.state import current

log = logging.getLogger("npudist.checkpoint")

# Seconds; the exporter turns these into npudist_checkpoint_{snapshot,write}_duration_seconds.
DURATION_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, float("inf"))


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says what happened and what is intact."""


TEST_DELAY_VAR = "NPUDIST_TEST_CHECKPOINT_DELAY_S"
"""Test harnesses only: SlowDisk.background_s for a launched process."""
SYNC_DELAY_VAR = "NPUDIST_TEST_SYNC_CHECKPOINT_DELAY_S"
"""Test harnesses only: SlowDisk.sync_s for a launched process."""


@dataclass(frozen=True)
class SlowDisk:
    """A slow disk for tests: seconds a save waits before it publishes. A test in this process sets the
    writer's ``slow_disk``; a harness that launches ranks sets the two variables, read once when the
    process's writer is made (``writer()``), never inside ``save()``."""

    background_s: float = 0.0
    """An asynchronous write, between its files and its manifest."""
    sync_s: float = 0.0
    """Rank 0 in a synchronous save, while the other ranks wait in the checkpoint's control collective."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlowDisk:
        def seconds(name: str) -> float:
            raw = env.get(name, "").strip()
            try:
                return float(raw or 0)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number of seconds; unset it or give e.g. 0.5") from None

        return cls(background_s=seconds(TEST_DELAY_VAR), sync_s=seconds(SYNC_DELAY_VAR))


@dataclass(frozen=True)
class Durations:
    buckets: tuple[tuple[float, int], ...]
    """(upper bound in seconds, cumulative count); the last bound is inf."""
    sum_seconds: float
    count: int


@dataclass(frozen=True)
class CheckpointStats:
    snapshot: Durations
    """Time save() held the caller: the host copy for async saves, the whole save for sync ones."""
    write: Durations
    """Writing, fsync, checksums, manifest and rename of one checkpoint (background or inline)."""
    bytes: int
    """Bytes of the checkpoints this rank published (rank 0 counts every rank's shard files)."""
    inflight: int
    waits: int
    """Saves that had to wait for the previous background write to finish."""
    failures: int
    peer: Any = None
    """The in-memory peer snapshots' PeerStats (peer.py), when they are on."""


def _durations(histogram: Histogram) -> Durations:
    b = histogram.snapshot()
    return Durations(b.pairs, b.sum, b.count)


class SaveHandle:
    """An asynchronous save: ``done()`` says whether its write finished, ``wait()`` returns its directory
    (None on ranks that publish nothing) or raises its CheckpointError."""

    def __init__(self, step: int, result: Path | None = None) -> None:
        self.step = step
        self._result = result
        self._error: CheckpointError | None = None
        self._surfaced = False
        self._finished = threading.Event()
        self._finished.set()  # until a writer takes it on (handles of ranks that write nothing stay done)

    def done(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> Path | None:
        if not self._finished.wait(timeout):
            raise TimeoutError(f"checkpoint step {self.step} is still being written after {timeout} s")
        if self._error is not None:
            self._surfaced = True
            raise self._error
        return self._result

    def _join(self) -> None:
        self._finished.wait()

    def _take_error(self) -> CheckpointError | None:
        """The write's error if nobody has raised it yet (then it counts as raised)."""
        if self._error is None or self._surfaced:
            return None
        self._surfaced = True
        return self._error


class CheckpointWriter:
    def __init__(self, slow_disk: SlowDisk = SlowDisk()) -> None:
        self.slow_disk = slow_disk
        self._lock = threading.Lock()
        self._job: SaveHandle | None = None
        self._staging: HostStaging | None = None
        self._snapshot, self._write = Histogram(DURATION_BUCKETS), Histogram(DURATION_BUCKETS)
        self._bytes = self._waits = self._failures = 0
        self._thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.peer: Any = None
        """The in-memory peer snapshots' sender (peer.py), when launch turned them on; its sends run here."""
        self.unused: Any = None
        """peer_unused.py's step count while launch asked for peer snapshots and none was sent."""

    def settle(self, *, count_wait: bool = True) -> CheckpointError | None:
        """Wait for the write in flight (counted and logged when a save had to wait); return the
        error of the last background write if it has not been raised yet."""
        job = self._job
        if job is None:
            return None
        if not count_wait:
            job._join()
        elif not job.done():
            began = time.perf_counter()
            job._join()
            with self._lock:
                self._waits += 1
            log.warning("checkpoint step %d was still being written: the training loop waited %.3f s for it "
                        "(one write at a time; checkpoint less often or to faster storage)", job.step,
                        time.perf_counter() - began)
        return job._take_error()

    def start(self, step: int, work: Callable[[], tuple[Path | None, int]], *, on_error: Callable[[Exception],
              CheckpointError]) -> SaveHandle:
        """Run ``work`` (returns the published directory and its bytes) on the writer thread; one at a time."""
        handle = SaveHandle(step)
        handle._finished.clear()

        def run() -> None:
            began = time.perf_counter()
            try:
                handle._result, nbytes = work()
            except Exception as exc:
                handle._error = on_error(exc)
                log.error("background checkpoint write failed: %s", handle._error)
                self.record(failed=True)
            else:
                self.record(write_s=time.perf_counter() - began, nbytes=nbytes)
            finally:
                handle._finished.set()

        self._job = handle
        self._ensure_thread().put(run)
        return handle

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the writer thread after the work queued before it (peer snapshot sends)."""
        self._ensure_thread().put(job)

    def _ensure_thread(self) -> queue.SimpleQueue:
        """One long-lived thread: starting a thread per save cost the caller 6 ms (Thread.start()
        waits until the new thread runs) on a loaded host; a queue hand-off costs microseconds."""
        if self._thread is None or not self._thread.is_alive():
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=_serve, args=(self._queue,), name="npudist-checkpoint-writer",
                                            daemon=True)
            self._thread.start()
        return self._queue

    def record(self, *, snapshot_s: float | None = None, write_s: float | None = None, nbytes: int = 0,
               failed: bool = False) -> None:
        with self._lock:
            if snapshot_s is not None:
                self._snapshot.observe(snapshot_s)
            if write_s is not None:
                self._write.observe(write_s)
            self._bytes += nbytes
            self._failures += int(failed)

    def stats(self) -> CheckpointStats:
        with self._lock:
            return CheckpointStats(_durations(self._snapshot), _durations(self._write), self._bytes,
                                   int(self._job is not None and not self._job.done()), self._waits,
                                   self._failures, self._peer_stats())

    def _peer_stats(self) -> Any:
        if self.peer is not None and (self.unused is None or self.peer.stats.snapshots > 0):
            return self.peer.snapshot_stats()
        return self.unused.stats() if self.unused is not None else None

    def host_copy(self, state: Any) -> Any:
        """A copy of ``state`` that training can no longer change: device tensors copied into host buffers
        reused from one save to the next (staging.py; safe because a save starts only after the last write
        ended), host tensors cloned."""
        if self._staging is None:
            self._staging = HostStaging()
        return self._staging.stage(state)

    def close(self) -> CheckpointError | None:
        """Wait for the last write; stop the thread; drop the staging buffers; return an unraised error."""
        error = self.settle(count_wait=False)
        if self.unused is not None:
            self.unused.close()
            self.unused = None
        if self.peer is not None:
            self.peer.close()  # its last send, queued on the thread below, lands first
            self.peer = None
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._staging is not None:
            self._staging.close()
        self._staging = None
        return error


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        job()


def writer() -> CheckpointWriter:
    """The current Runtime's writer, attached on first use."""
    rt = current()
    w = rt.checkpoints
    if w is None:
        with rt.lock:
            if rt.checkpoints is None:
                rt.checkpoints = CheckpointWriter(SlowDisk.from_env(os.environ))
            w = rt.checkpoints
    return w
