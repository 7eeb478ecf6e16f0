"""What npudist.comm keeps between calls, owned by the process's Runtime, and the switches over it.

A CommState holds the per-group facts (context.py), the recorder, the hang watchdog, the scratch
buffer pool and all_reduce_many's bucket layouts. It is attached to the Runtime on the first
collective and ended by ``Runtime.close()`` (``npudist.shutdown()``), so a new process group after a
shutdown starts from nothing cached. The public functions below change or read the current one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from npudist.comm import constraints as _constraints
from npudist.comm import pg_watch
from npudist.comm.buffers import BufferPool, LayoutCache
from npudist.comm.constraints import Constraints
from npudist.comm.hang.reader import HangReader
from npudist.comm.hang.store import read_places
from npudist.comm.hang.watchdog import Watchdog
from npudist.comm.quiesce import quiesce
from npudist.comm.recorder import CommStats, Recorder
from npudist.diagnosis.place import Place
from npudist.runtime.settings import Settings
from npudist.runtime.state import Runtime, current, peek


class CommState:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.groups: dict[object, Any] = {}
        """Process group (None: not initialised) -> its cached facts (context.GroupContext, which reads
        this state, so it is not named here)."""
        self.debug: bool | None = None
        """set_debug(): overrides Settings.comm_debug while not None."""
        self.profile: str | None = None
        """set_profile(): overrides Settings.comm_profile while not None."""
        self.recorder = Recorder()
        self.watchdog = Watchdog(run_dir=settings.run_dir, enabled=settings.watchdog,
                                 hang_timeout_s=settings.hang_timeout_s, hang_action=settings.hang_action,
                                 reader_factory=HangReader, stuck_timeout_s=settings.stuck_timeout_s,
                                 busy_timeout_s=settings.busy_timeout_s, watch_mode=settings.pg_watch)
        self.pool = BufferPool()
        self.layouts = LayoutCache()
        self.side_group: object | None = None
        """control.side_group(): the gloo group of background (DCP) collectives, once asked for."""

    def close(self) -> None:
        """Join the watchdog's publisher and drop every cached group and buffer."""
        self.watchdog.close()
        self.side_group = None
        self.groups.clear()
        self.pool.clear()
        self.layouts.clear()


def state() -> CommState:
    """The current Runtime's CommState, attached on first use."""
    rt = current()
    st = rt.comm
    return st if st is not None else _attach(rt)


def _attach(rt: Runtime) -> CommState:
    with rt.lock:
        if rt.comm is None:
            rt.comm = CommState(rt.settings)
            attached = True
        else:
            attached = False
    if attached:  # outside the lock: own() takes it
        rt.own("backend", _rest_backend)
    return rt.comm


def _rest_backend() -> None:
    """The rank's last step before the interpreter finalizes, at exit too (quiesce.py says why). The watch's
    counters are what tell a collective in flight, so they are forgotten only after the wait; then the next
    process group of this process counts from zero."""
    quiesce()
    if pg_watch.loaded():
        pg_watch.reset()


def set_debug(on: bool | None) -> None:
    """Turn the cross-rank size handshake on or off in-process (None: back to NPUDIST_COMM_DEBUG)."""
    st = state()
    st.debug = on
    st.groups.clear()


def set_profile(name: str | None) -> None:
    """Apply a constraint profile in-process (None: back to NPUDIST_COMM_PROFILE / the backend's row)."""
    if name is not None:
        _constraints.profile(name)
    st = state()
    st.profile = name
    st.groups.clear()


def active_constraints(group: object | None = None) -> Constraints:
    """The active row: set_profile(), else NPUDIST_COMM_PROFILE, else the running backend's row."""
    st = state()
    return _constraints.select(st.profile or st.settings.comm_profile, group)


def stats() -> CommStats:
    """Immutable snapshot of every collective recorded since this process's Runtime started."""
    return state().recorder.snapshot()


def set_recording(on: bool) -> None:
    """Turn the accounting of collectives on or off in-process (on by default)."""
    state().recorder.enabled = bool(on)


def reset_stats() -> None:
    """Start counting afresh (tests, benchmarks)."""
    state().recorder.reset()


def set_run_dir(path: str | os.PathLike | None) -> None:
    """Where hang reports are written (default: NPUDIST_RUN_DIR)."""
    state().watchdog.run_dir = str(path) if path else None


def start_watchdog() -> None:
    """Start this rank's hang watchdog now (init() calls it once the group exists)."""
    state().watchdog.start()


@contextlib.contextmanager
def busy(label: str) -> Iterator[None]:
    """``with npudist.busy("evaluation"):`` a phase in which the other ranks' wait for this one is expected.

    The hang verdict then reports the wait as declared and never aborts it (NPUDIST_BUSY_TIMEOUT, if set,
    still applies); a rank that stops or dies inside the block is still named and aborted. Costs two
    attribute writes; outside an npudist Runtime it does nothing.
    """
    rt = peek()
    if rt is None:
        yield
        return
    st = rt.comm if rt.comm is not None else _attach(rt)
    with st.watchdog.busy(label):
        yield


def where(ranks: list[int]) -> dict[int, Place]:
    """Where ``ranks`` run (host, pid, local rank, accelerator) as each published at its start, for
    diagnoses that name them; {} outside a job or when the store cannot tell (one ``check`` and one
    ``multi_get``)."""
    rt = peek()
    wd = rt.comm.watchdog if rt is not None and rt.comm is not None else None
    if wd is None or wd.record is None:
        return {}
    try:
        return read_places(wd._connect(), ranks)
    except Exception:  # a diagnosis is written without the names rather than not at all
        return {}


def progress() -> dict[str, object] | None:
    """This rank's hang-watchdog record (collective number, op, bytes, state, step), or None before the
    first collective: what rank 0's hang verdict will say about this rank."""
    wd = state().watchdog
    if wd.native:
        wd.refresh()
    rec = wd.record
    return dict(vars(rec)) if rec is not None else None


def collective_seconds() -> float | None:
    """Seconds this rank has had any collective in flight, on any group and from any caller (the process-group
    watch, pg_watch.py); None where the watch is not running in this process."""
    rt = peek()
    wd = rt.comm.watchdog if rt is not None and rt.comm is not None else None
    if wd is None or not wd.native:
        return None
    from npudist.comm import pg_watch

    return pg_watch.busy_seconds()


def store_rtt_seconds() -> float | None:
    """This rank's median round trip to the job's store, from its watchdog's control polls (one a
    second); None before the first poll or without a watchdog."""
    rt = peek()  # a scrape never starts a Runtime
    return rt.comm.watchdog.store_rtt_s if rt is not None and rt.comm is not None else None


def hang_stall_seconds() -> float | None:
    """Seconds since any rank's last collective progress, as this rank's hang reader saw it at its last
    read; None on ranks without the reader (all but rank 0) or before its first read."""
    rt = peek()  # a scrape never starts a Runtime
    reader = rt.comm.watchdog.reader if rt is not None and rt.comm is not None else None
    return reader.stalled_s if reader is not None else None
