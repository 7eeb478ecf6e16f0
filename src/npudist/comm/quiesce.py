"""Backend threads at rest before the interpreter finalizes: the last step of a rank's teardown.

Why: a finished rank could still die with ``terminate called without an active exception`` (SIGABRT) at
exit, its work done (issue 46). Found with a native backtrace at the abort: a gloo worker thread
(``ProcessGroupGloo::runLoop``) dropped the last reference to a finished collective's tensor whose Python
object it owned (the script had already let go of the tensor: DDP's bucket handed to a Python comm hook, a
temporary passed to an async collective), so the drop asks for the GIL (``TensorImpl::decref_pyobject``).
When that request waits behind a main thread that then starts finalizing, CPython ends the waiting
thread with ``pthread_exit``; the forced unwind meets a ``noexcept`` frame of the C++ runtime and the
process aborts. The window is short, and widens when the worker thread is descheduled, hence the
"under load" runs. torch itself leaves it open: its fix (registering ``destroy_process_group`` at exit,
pytorch/pytorch#179291) was abandoned, and a script's DDP module keeps a destroyed gloo group, and its
threads, alive to the end anyway.

So before the interpreter finalizes, ``quiesce()`` waits (bounded) until this rank has no collective in
flight (the process-group watch's counters, where it is loaded) and every native thread the backend
started (threads that Python's ``threading`` did not start: gloo's workers and loop, NCCL's and HCCL's) has
been seen asleep in two samples in a row while this thread sleeps without the GIL: a worker that wanted the
GIL for such a drop gets it then, while the interpreter is whole. The Runtime runs it after the process
group is ended (``CLOSE_ORDER``'s ``backend``), also from the exit hook of a script that never called
``npudist.shutdown()``.

A collective that failed (a timeout, a peer gone) stays in flight in the watch's counters (pg_watch.cpp
counts only completions), and nothing will ever complete it: when the rank is leaving on a collective's
exception, the in-flight part of the wait is skipped (``collective_failed``) and only the threads' rest is
waited for, so a failing rank does not sit out the whole bound before its launcher hears of the failure.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType

log = logging.getLogger("npudist.comm")

QUIESCE_S = 3.0
"""Longest wait at exit: past it the rank exits as before (a peer that never answers an in-flight call must
not hold a finished rank)."""
SAMPLE_S = 0.01
QUIET_SAMPLES = 2
"""Samples in a row with every backend thread asleep: one could catch a worker between two states."""
TASKS = "/proc/self/task"


@dataclass(frozen=True)
class ThreadState:
    tid: int
    name: str
    state: str
    """The kernel's one-letter state (``R`` running or runnable, ``S`` asleep, ``D`` in I/O...)."""


@dataclass(frozen=True)
class Quiet:
    """What ``quiesce()`` saw: how long it waited and what was still busy when it stopped waiting."""

    waited_s: float
    in_flight: int
    """Collectives still in flight on this rank when it stopped (0 when quiet)."""
    busy: tuple[str, ...]
    """Names of the backend threads not asleep when it stopped (empty when quiet)."""

    @property
    def quiet(self) -> bool:
        return self.in_flight == 0 and not self.busy


def parse_stat(tid: int, text: str) -> ThreadState | None:
    """One ``/proc/self/task/TID/stat`` line; None for an unreadable one. The name sits in parentheses and may
    itself hold spaces and parentheses, so the state is the field after the last ``)`` (proc(5))."""
    head, sep, tail = text.rpartition(")")
    start = head.find("(")
    fields = tail.split()
    if not sep or start < 0 or not fields:
        return None
    return ThreadState(tid=tid, name=head[start + 1:], state=fields[0])


def read_threads(root: str = TASKS) -> list[ThreadState]:
    """This process's threads as the kernel sees them; empty where there is no /proc."""
    out = []
    try:
        tids = os.listdir(root)
    except OSError:
        return out
    for entry in tids:
        try:
            with open(os.path.join(root, entry, "stat")) as f:
                state = parse_stat(int(entry), f.read())
        except (OSError, ValueError):  # a thread that ended between the listing and the read
            continue
        if state is not None:
            out.append(state)
    return out


def backend_busy(threads: Iterable[ThreadState], python_ids: set[int]) -> tuple[str, ...]:
    """Names of the native threads (not started by Python's ``threading``, not the caller) that are not asleep.

    Python's own threads are left out on purpose: npudist's are joined before this runs, and a script's
    are its own to end (a busy one would only make every exit wait the whole bound)."""
    return tuple(sorted(t.name for t in threads if t.tid not in python_ids and t.state != "S"))


def in_flight() -> int:
    """Collectives entered and not completed on this rank, from the process-group watch; 0 where it is not
    loaded (nothing to count with)."""
    from npudist.comm import pg_watch

    if pg_watch.why_off() is not None:
        return 0
    try:
        snap = pg_watch.snapshot()
    except Exception:  # the watch was never loaded in this process
        return 0
    return sum(max(0, g.entered - g.done) + max(0, g.p2p_entered - g.p2p_done) for g in snap.groups)


_COLLECTIVE_CODE = (("torch", "distributed"), ("npudist", "comm"))
"""Where a collective's exception is raised from: torch.distributed (c10d, its Work.wait) or npudist.comm's
door (CollectiveHangError). A gloo failure is a plain RuntimeError, so the traceback tells, not the type."""


def _from_collective(tb: TracebackType | None) -> bool:
    """Whether the innermost frame (where it was raised) is a collective's code. Only that one: a frame further
    out may be a wrapper around any code (torchrun's ``@record`` lives in torch.distributed.elastic)."""
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    parts = tuple(tb.tb_frame.f_code.co_filename.replace("\\", "/").split("/"))
    return any(parts[i:i + 2] == code for code in _COLLECTIVE_CODE for i in range(len(parts) - 1))


def failed_by_collective(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or one it was raised from or during) is a collective's failure: torch's DistError, or
    an exception raised inside torch.distributed or npudist.comm."""
    from npudist.runtime.compat import is_dist_error

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if is_dist_error(exc) or _from_collective(exc.__traceback__):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def collective_failed() -> bool:
    """Whether this rank is leaving on a collective's exception: the one being handled (``shutdown()`` in an
    ``except``/``finally``), or the one that ended the script (CPython sets ``sys.last_value`` before the
    exit hooks run)."""
    return failed_by_collective(sys.exc_info()[1]) or failed_by_collective(getattr(sys, "last_value", None))


def _python_ids() -> set[int]:
    ids = {t.native_id for t in threading.enumerate() if t.native_id is not None}
    ids.add(threading.get_native_id())
    return ids


def quiesce(timeout_s: float = QUIESCE_S, *, threads: Callable[[], list[ThreadState]] = read_threads,
            flying: Callable[[], int] = in_flight, python_ids: Callable[[], set[int]] = _python_ids,
            sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
            failed: Callable[[], bool] = collective_failed) -> Quiet:
    """Wait until no collective is in flight and the backend's threads are at rest, at most ``timeout_s``;
    only for the threads when the rank leaves on a failed collective (nothing completes what is in flight)."""
    began = clock()
    quiet_in_a_row = 0
    count_flying = not failed()
    while True:
        n, busy = flying() if count_flying else 0, backend_busy(threads(), python_ids())
        quiet_in_a_row = quiet_in_a_row + 1 if n == 0 and not busy else 0
        waited = clock() - began
        if quiet_in_a_row >= QUIET_SAMPLES:
            return Quiet(waited_s=waited, in_flight=0, busy=())
        if waited >= timeout_s:
            log.debug("npudist: exiting with %d collective(s) in flight and backend threads busy: %s", n,
                      ", ".join(busy) or "none")
            return Quiet(waited_s=waited, in_flight=n, busy=busy)
        sleep(SAMPLE_S)  # without the GIL: a backend thread waiting for it gets it now
