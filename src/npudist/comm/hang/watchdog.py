"""Each rank's hang watchdog: it numbers the rank's collectives, publishes its progress record, answers rank
0's probes and obeys its abort order.

Numbering: the process-group watch (pg_watch.py) counts every collective on every group in C++, whoever
issues it, and this thread reads its counters once a period; where the watch is off (no compiler, another
torch, a ProcessGroup written in Python such as the simulated hccl) npudist's own collectives (and DDP's
forward-time ones, ddp.py) are numbered here instead (enter/done: attribute writes only).

Store traffic is the daemon thread's alone, once per ``PUBLISH_INTERVAL_S``: the record when it changed (one
``set``), the job's control counter (one ``add``: a probe to answer with two looks at the main thread, or the
order to exit with HANG_EXIT_CODE), and on rank 0 the job's one hang reader (reader.py: one ``multi_get``) and,
once, the ranks' timeouts compared (agree.py). So a rank makes at most 2 store requests a second, and the job's
diagnosis O(N), through the store client the process group already holds. Keys and reads: store.py; a failed
collective's error: failure.py; the exit: abort_note.py. The CommState owns the one Watchdog of a process and
closes it with the Runtime (the thread must be joined before the process group goes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from npudist.comm import pg_watch
from npudist.comm.hang import agree, failure
from npudist.comm.hang.abort_note import abort
from npudist.comm.hang.failure import NATIVE, CollectiveHangError
from npudist.comm.hang.main_thread import look_at_main
from npudist.comm.hang.store import (
    _key,
    _published_verdict,
    _where_i_run,
    answers_key,
    ctl_key,
    group_key,
    members_doc,
    read_records,
    shared_store,
    stack_key,
    want_key,
    who_key,
)
from npudist.diagnosis.record import GROUPS_AT_MOST, Record, Records
from npudist.runtime.env import launcher_env

log = logging.getLogger("npudist.comm")
DIST_STORE_ERRORS = (RuntimeError, OSError, TimeoutError)
"""What a TCPStore call raises when the store is out of reach (torch's DistStoreError is a RuntimeError)."""
PUBLISH_INTERVAL_S = 1.0
"""The watchdog thread's period: one record publish and one control poll per period at most."""
STORE_RTT_SAMPLES = 8
"""The store round trip a rank reports is the median of its last this many control polls (one a period):
one slow poll (a pause of the process) moves nothing, a slow link moves it within seconds."""
HANG_EXIT_CODE = 124
"""Exit status of a rank aborted after a hang verdict (timeout(1)'s "timed out")."""
ABORT_STEP = 1_000_000
"""Added to the control counter to order an abort; smaller increments are probes."""
STANDBY_RANK = 1
"""Rank 1's watchdog stands in for rank 0's hang reader when rank 0 goes silent (hang_reader.py)."""
VERDICT_WAIT_S = 6.0
"""How long a failing rank other than 0 waits for rank 0's verdict before judging from the records."""
CUT_OFF_S = 10.0
"""A rank inside a collective whose every store call has failed for this long (or the hang bound, when set) is
cut off from its job (its node partitioned and the job went on elastically, or the job is gone): it exits, so
torchrun's agent on its node rejoins the job (a new rendezvous round) instead of leaving it blocked until the
collective timeout. Store calls may block while a cable is out and fail once the route is back: this fires then."""


class Watchdog:
    def __init__(self, run_dir: str | None = None, enabled: bool = True, hang_timeout_s: float | None = None,
                 hang_action: str = "abort", reader_factory: Callable[..., Any] | None = None,
                 stuck_timeout_s: float = 300.0, busy_timeout_s: float | None = None,
                 watch_mode: str = "native") -> None:
        self.enabled = enabled
        """False (NPUDIST_WATCHDOG_OFF): calls are neither numbered nor published."""
        self.record: Record | None = None
        self.hang_timeout_s = hang_timeout_s
        self.hang_action = hang_action
        """abort, report or off (NPUDIST_HANG_ACTION)."""
        self.stuck_timeout_s = stuck_timeout_s
        """NPUDIST_STUCK_TIMEOUT: stall after which a live rank that does nothing is aborted."""
        self.busy_timeout_s = busy_timeout_s
        """NPUDIST_BUSY_TIMEOUT: stall after which a busy rank is aborted (None: never)."""
        self.busy_phase: tuple[str, float] | None = None
        """(label, monotonic start) of the innermost npudist.busy() block on this rank's main thread."""
        self._who_sent = False
        self.reader: Any = None
        """Rank 0's HangReader (hang_reader.py), started with the thread; None elsewhere."""
        self.standby: Any = None
        """Rank 1's stand-in for rank 0's reader (hang_reader.py); None elsewhere."""
        self.agree: agree.TimeoutsCheck | None = None  # rank 0's timeouts comparison (agree.py) until done
        self.reader_factory = reader_factory
        """Builds the reader from (this watchdog, world size, standby=...); the CommState passes HangReader."""
        self._off = not enabled
        """True once numbering is known to be off for this Runtime (disabled, or a world of one)."""
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: Any = None
        self._ctl_seen = 0
        self._failures = 0
        self._failing_since: float | None = None
        self._failing_seq: int | None = None
        self._rtts: deque[float] = deque(maxlen=STORE_RTT_SAMPLES)
        self.watch_mode = watch_mode
        """native or off (NPUDIST_PG_WATCH)."""
        self.native = False
        """True while the process-group watch numbers every collective (enter/done then do nothing)."""
        self._native_seen: tuple[Any, ...] = ()
        self._groups_sent: set[str] = set()
        self._sync_lock = threading.Lock()
        self._reader_faults = 0
        self._label: str | None = None
        """npudist's own name for the call in progress on this rank, while the watch numbers it."""
        self.run_dir = run_dir
        """Where hang reports are written (None: nowhere)."""

    def _ensure(self) -> Record | None:
        if not self.enabled:
            return None
        if self.record is None:
            if not (dist.is_available() and dist.is_initialized()):
                return None
            if dist.get_world_size() < 2:  # a world of one has nothing to wait for, for this Runtime's life
                self._off = True
                return None
            self.record = Record(rank=dist.get_rank())
            self.native = self.watch_mode == "native" and pg_watch.dispatched(dist.group.WORLD) and pg_watch.load()
            if self.record.rank == 0:
                self.agree = agree.TimeoutsCheck(dist.get_world_size())
            if self.hang_action != "off" and self.reader_factory is not None:
                if self.record.rank == 0:
                    self.reader = self.reader_factory(self, dist.get_world_size())
                elif self.record.rank == STANDBY_RANK:
                    self.standby = self.reader_factory(self, dist.get_world_size(), standby=True)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._loop, args=(self._stop,), name="npudist-watchdog",
                                            daemon=True)
            self._thread.start()
        return self.record

    def start(self) -> None:
        """Start the thread now (init() calls it), so a rank that takes long before its first collective
        (loading data, compiling) can already answer the probe and rank 0's reader already runs."""
        if not self._off and self._ensure() is not None and not self._who_sent:
            self._dirty.set()

    @contextlib.contextmanager
    def busy(self, label: str) -> Iterator[None]:
        """Mark a phase in which the other ranks' wait is expected (rank_states.DECLARED)."""
        outer, self.busy_phase = self.busy_phase, (str(label)[:200], time.monotonic())
        try:
            yield
        finally:
            self.busy_phase = outer

    # enter/done run around every public collective: attribute writes, no syscall beyond the clock,
    # and the publisher is only signalled when it is not already due to publish.
    def enter(self, op: str, nbytes: int) -> int:
        rec = self.record
        if rec is None and (self._off or (rec := self._ensure()) is None):
            return 0
        if self.native:
            self._label = op  # npudist's name for the call the watch numbers ("control all_reduce", "ddp_forward")
            return NATIVE
        rec.seq += 1
        rec.op, rec.nbytes, rec.state, rec.wall_time = op, nbytes, "entered", time.time()
        if not self._dirty.is_set():
            self._dirty.set()
        return rec.seq

    def done(self, seq: int) -> None:
        if seq == NATIVE:
            self._label = None
            return
        rec = self.record
        if rec is not None and rec.seq == seq:
            rec.state, rec.wall_time = "done", time.time()
            if not self._dirty.is_set():
                self._dirty.set()

    @property
    def store_rtt_s(self) -> float | None:
        """Median seconds of this rank's recent round trips to the job's store (None before the first).
        The store is on the master's node, so a rank behind a slow or lossy link sees it in every one."""
        samples = sorted(tuple(self._rtts))  # tuple(): one C-level copy while the thread appends
        return samples[len(samples) // 2] if samples else None

    def step_started(self) -> None:
        """A training step began (DDP's forward with gradients): counted in the record."""
        rec = self.record
        if rec is not None:
            rec.step += 1

    def _connect(self) -> Any:
        if self._store is None:
            self._store = shared_store()
            if self._store is None:  # a group made without a store we can reach: our own client
                where = launcher_env(os.environ)
                if not where.master_addr or not where.master_port.isdigit():
                    return None
                self._store = dist.TCPStore(where.master_addr, int(where.master_port), is_master=False,
                                            timeout=timedelta(seconds=10), wait_for_workers=False)
        return self._store

    def refresh(self) -> None:
        """Bring the record up to the process-group watch's counters now (the thread does it once a period)."""
        with self._sync_lock:
            self._sync_native()

    def _sync_native(self) -> None:
        """The record from the process-group watch's counters: the call the rank waits in (its oldest in
        flight, else its last), its number on its group, and the rank's count on every group it used."""
        rec = self.record
        if rec is None or not self.native or rec.state == "closed":
            return
        snap = pg_watch.snapshot()
        cur = snap.current()
        state = "entered" if snap.waiting else ("done" if snap.total else "idle")
        seen = (snap.total, state, cur, rec.step, self._label)
        if seen == self._native_seen:
            return
        self._native_seen = seen
        rec.seq, rec.state = snap.total, state
        if cur is not None:
            label = self._label
            rec.op = label if label and state == "entered" else cur.op
            rec.nbytes, rec.group, rec.gseq, rec.wall_time = cur.nbytes, cur.name, cur.entered, cur.since
        rec.groups = {g.name: g.entered for g in snap.groups[:GROUPS_AT_MOST]}
        self._dirty.set()

    def _publish(self) -> None:
        rec = self.record
        store = self._connect()
        if rec is None or store is None:
            return
        if not self._who_sent:
            store.set(who_key(rec.rank), json.dumps(_where_i_run()))
            agree.publish(store, rec.rank, os.environ)
            self._who_sent = True
        for name in [g for g in rec.groups if g not in self._groups_sent]:
            self._groups_sent.add(name)
            doc = members_doc(name)
            if doc is not None:  # one compare_set per group a rank uses: the first member's copy stays
                store.compare_set(group_key(name), "", json.dumps(doc))
        store.set(_key(rec.rank), json.dumps(asdict(rec)))

    def _poll(self) -> None:
        """One ``add(ctl, 0)``: answer a new probe naming this rank, or exit on an abort order."""
        rec, store = self.record, self._connect()
        if rec is None or store is None:
            return
        began = time.monotonic()
        value = int(store.add(ctl_key(), 0))
        self._rtts.append(time.monotonic() - began)
        if value == self._ctl_seen:
            return
        self._ctl_seen = value
        if value >= ABORT_STEP:  # the ordering rank exits on its own, before its next poll
            said = _published_verdict(store) or {}
            line, when = said.get("line"), said.get("time")
            self._abort(f"rank {rec.rank}: exiting on the hang reader's order",
                        verdict_line=line if isinstance(line, str) else None,
                        verdict_time=when if isinstance(when, int | float) else None)
        gen = value % ABORT_STEP
        if gen and self.reader is None:
            wanted = store.get(want_key()).decode()
            if str(rec.rank) in wanted.split(","):
                store.set(stack_key(rec.rank), look_at_main(self.busy_phase, self._stop.wait).to_json())
                store.append(answers_key(gen), f"{rec.rank},")

    def _abort(self, message: str, *, verdict_line: str | None = None, verdict_time: float | None = None) -> None:
        """Exit with HANG_EXIT_CODE (abort_note.py's abort)."""
        abort(message, verdict_line=verdict_line, verdict_time=verdict_time, code=HANG_EXIT_CODE)

    def _loop(self, stop: threading.Event) -> None:
        # A change is published as soon as it happens if the last publish is a period old, else at the end
        # of that period (a stopped rank's record lags by at most one period); the control counter is
        # polled and the reader ticks once per period.
        last_publish = next_poll = 0.0
        while not stop.is_set():
            now = time.monotonic()
            wake = next_poll if self._dirty.is_set() else min(next_poll, now + PUBLISH_INTERVAL_S)
            if self._dirty.is_set():
                wake = min(wake, last_publish + PUBLISH_INTERVAL_S)
                if wake > now:
                    stop.wait(wake - now)
            else:
                self._dirty.wait(max(0.0, wake - now))
            if stop.is_set():
                return
            now = time.monotonic()
            try:
                if self.native:
                    self.refresh()
                if self._dirty.is_set() and now >= last_publish + PUBLISH_INTERVAL_S:
                    self._dirty.clear()
                    last_publish = now
                    self._publish()
                if now >= next_poll:
                    next_poll = now + PUBLISH_INTERVAL_S
                    self._poll()
                    self._tick_readers()
                    if self.agree is not None and self.agree.tick(self._connect()):
                        self.agree = None
                self._failing_since = None
            except Exception as exc:  # the watchdog must never take the job down
                (log.debug if self._failures else log.warning)(
                    "npudist watchdog: store call failed (%s: %s); hang diagnosis may be late",
                    type(exc).__name__, exc)
                self._failures += 1
                self._cut_off(now, exc)

    def _tick_readers(self) -> None:
        """The reader's period, after a poll that reached the store: a fault in the reader itself is logged and
        never taken for a lost store (which would make this rank exit as cut off from a job it is part of)."""
        for reader in (self.reader, self.standby):
            if reader is None:
                continue
            try:
                reader.tick()
            except Exception as exc:
                if isinstance(exc, DIST_STORE_ERRORS):
                    raise
                self._reader_faults += 1
                (log.warning if self._reader_faults == 1 else log.debug)(
                    "npudist hang reader: %s: %s (diagnosis continues without this period's verdict)",
                    type(exc).__name__, exc, exc_info=self._reader_faults == 1)

    def _cut_off(self, now: float, exc: Exception) -> None:
        """Exit when this rank has been cut off from its job for CUT_OFF_S inside a collective."""
        rec = self.record
        # Cut off means no store and no progress: a collective that completes while the store is out of
        # reach (a store host rebooting, a blip on its network) restarts the count.
        seq = rec.seq if rec is not None else None
        if self._failing_since is None or seq != self._failing_seq:
            self._failing_since, self._failing_seq = now, seq
        lost_s = now - self._failing_since
        if rec is None or rec.state != "entered" or self.hang_action != "abort" \
                or lost_s < (self.hang_timeout_s or CUT_OFF_S):
            return
        where = launcher_env(os.environ).address()
        self._abort(f"rank {rec.rank} ({socket.gethostname()}): cut off from the job for {lost_s:.0f} s inside "
                    f"{rec.op} #{rec.seq}: every call to the job's store at {where} fails "
                    f"({type(exc).__name__}: {str(exc).strip()[:200]}). This node was partitioned from the "
                    "job, which went on without it or ended; exiting so that its agent can rejoin")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop and join the thread and drop the store client; the next collective starts afresh.

        Safe to call twice. A thread stuck in a store call longer than ``timeout_s`` is left behind.
        """
        thread, self._thread = self._thread, None
        rec, store = self.record, self._store
        if thread is not None and rec is not None and store is not None:
            # Where this rank stopped, for the others' verdict (it may leave a step early).
            try:
                rec.state, rec.wall_time = "closed", time.time()
                store.set(_key(rec.rank), json.dumps(asdict(rec)))
            except Exception as exc:
                log.debug("watchdog: last record not published: %s", exc)
        self.record = None
        self.reader = None
        self.standby = None
        self.agree = None
        self._who_sent = False
        self.native, self._native_seen = False, ()
        self._groups_sent.clear()
        self._stop.set()
        self._dirty.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("npudist watchdog thread did not stop within %.0f s", timeout_s)
        self._store = None
        self._ctl_seen = 0
        self._dirty.clear()

    def records(self) -> Records:
        """Every rank's record as published (store.py's read_records)."""
        return read_records(self._connect(), dist.get_world_size())

    def diagnose(self, op: str, seq: int, nbytes: int, exc: BaseException) -> CollectiveHangError | None:
        """The hang report for ``exc``, or None (the caller re-raises ``exc``): failure.py's diagnose."""
        return failure.diagnose(self, op=op, seq=seq, nbytes=nbytes, exc=exc, period_s=PUBLISH_INTERVAL_S,
                                verdict_wait_s=VERDICT_WAIT_S)
