"""Hang diagnosis: which rank stopped before which collective.

Every npudist collective takes a per-rank sequence number. The calling thread only updates a small
record (op, sequence number, bytes, state); a daemon thread publishes it to the c10d store of the
job every ``interval`` seconds when it changed, so the hot path pays no network round trip. When a
collective fails (a timeout, a peer gone), the failing rank reads every rank's record and raises
CollectiveHangError naming the op, its sequence number and the ranks that had and had not reached
it, and writes the same as JSON into the run directory (``NPUDIST_RUN_DIR`` or set_run_dir()).

The CommState owns the one Watchdog of a process and closes it with the Runtime (see Runtime.close for
why the publisher must be joined before the process group goes). watched.py numbers the calls.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch.distributed as dist

log = logging.getLogger("npudist.comm")
PUBLISH_INTERVAL_S = 0.5


class CollectiveHangError(RuntimeError):
    """A collective did not complete; the message names the ranks that never reached it."""

    def __init__(self, message: str, report: dict[str, Any]) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class Record:
    rank: int
    seq: int = 0
    op: str = ""
    nbytes: int = 0
    state: str = "idle"
    """entered (waiting inside the collective) or done."""
    wall_time: float = 0.0


@dataclass(frozen=True)
class BadRecord:
    """A store record that is not a Record (wrong JSON, wrong field types): reported, never trusted."""

    reason: str


_FIELD_TYPES = MappingProxyType(
    {"rank": int, "seq": int, "op": str, "nbytes": int, "state": str, "wall_time": (int, float)})


def parse_record(raw: bytes | str, rank: int) -> Record | BadRecord:
    """Rank ``rank``'s published record, or BadRecord saying what is wrong with it (pure; never raises)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return BadRecord(f"not JSON: {str(exc)[:80]}")
    if not isinstance(doc, dict) or set(doc) != set(_FIELD_TYPES):
        return BadRecord(f"expected an object with {', '.join(_FIELD_TYPES)}")
    wrong = [k for k, t in _FIELD_TYPES.items() if isinstance(doc[k], bool) or not isinstance(doc[k], t)]
    if wrong or not math.isfinite(doc["wall_time"]):
        return BadRecord(f"wrong type or value for {', '.join(wrong) or 'wall_time'}")
    if doc["rank"] != rank:
        return BadRecord(f"published for rank {rank} but names rank {doc['rank']}")
    return Record(**doc)


Records = dict[int, "Record | BadRecord | None"]


def _key(rank: int) -> str:
    # A restarted job (torchrun --max-restarts) must not read records of the previous attempt.
    return f"npudist/watchdog/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{rank}"


def reached(records: Records, seq: int) -> tuple[list[int], list[int]]:
    """Ranks whose record shows they entered collective ``seq`` (or a later one), and the rest."""
    got = sorted(r for r, rec in records.items() if isinstance(rec, Record) and rec.seq >= seq)
    return got, sorted(r for r in records if r not in got)


def _last_seen(r: int, rec: Record | BadRecord | None, now: float) -> str:
    if isinstance(rec, BadRecord):
        return f"rank {r}: bad record in the store ({rec.reason})"
    if rec is None or rec.seq == 0:
        return f"rank {r}: never reported"
    return f"rank {r}: last {rec.op} #{rec.seq} ({rec.state}, {now - rec.wall_time:.1f} s ago)"


def describe(op: str, seq: int, nbytes: int, rank: int, records: Records, cause: str) -> str:
    ok, missing = reached(records, seq)
    now = time.time()
    last = [_last_seen(r, records.get(r), now) for r in missing]
    who = (f"rank(s) {', '.join(map(str, missing))} never reached it ({'; '.join(last)})" if missing
           else "every rank reached it (a slow link or a peer that died inside it)")
    return (f"{op} #{seq} ({nbytes} bytes) failed on rank {rank}: {cause}. Ranks {', '.join(map(str, ok))} "
            f"reached it; {who}. Check the missing ranks' logs, hosts and devices first.")


class Watchdog:
    def __init__(self, run_dir: str | None = None, enabled: bool = True) -> None:
        self.enabled = enabled
        """False (NPUDIST_WATCHDOG_OFF): calls are neither numbered nor published."""
        self.record: Record | None = None
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: Any = None
        self._lock = threading.Lock()
        self.run_dir = run_dir
        """Where hang reports are written (None: nowhere)."""

    def _ensure(self) -> Record | None:
        if not self.enabled:
            return None
        if self.record is None:
            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
                return None
            self.record = Record(rank=dist.get_rank())
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._publish_loop, args=(self._stop,), name="npudist-watchdog",
                                            daemon=True)
            self._thread.start()
        return self.record

    # enter/done run around every public collective: attribute writes, no syscall beyond the clock,
    # and the publisher is only signalled when it is not already due to publish.
    def enter(self, op: str, nbytes: int) -> int:
        rec = self.record
        if rec is None:
            rec = self._ensure()
            if rec is None:
                return 0
        rec.seq += 1
        rec.op, rec.nbytes, rec.state, rec.wall_time = op, nbytes, "entered", time.time()
        if not self._dirty.is_set():
            self._dirty.set()
        return rec.seq

    def done(self, seq: int) -> None:
        rec = self.record
        if rec is not None and rec.seq == seq:
            rec.state, rec.wall_time = "done", time.time()
            if not self._dirty.is_set():
                self._dirty.set()

    def _connect(self) -> Any:
        if self._store is None:
            addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
            if not addr or not port:
                return None
            # Our own client connection: the process group's store is not shared with another thread.
            self._store = dist.TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=10),
                                        wait_for_workers=False)
        return self._store

    def _publish(self) -> None:
        rec = self.record
        store = self._connect()
        if rec is None or store is None:
            return
        with self._lock:
            store.set(_key(rec.rank), json.dumps(asdict(rec)))

    def _publish_loop(self, stop: threading.Event) -> None:
        while True:
            self._dirty.wait()
            if stop.is_set():
                return
            self._dirty.clear()
            try:
                self._publish()
            except Exception as exc:  # the watchdog must never take the job down
                log.debug("watchdog publish failed: %s", exc)
            if stop.wait(PUBLISH_INTERVAL_S):
                return

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop and join the publisher and drop the store connection; the next collective starts afresh.

        Safe to call twice. A publisher stuck in a store call longer than ``timeout_s`` is left behind.
        """
        thread, self._thread = self._thread, None
        self.record = None
        self._stop.set()
        self._dirty.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("npudist watchdog publisher did not stop within %.0f s", timeout_s)
        self._store = None
        self._dirty.clear()

    def records(self) -> Records:
        store = self._connect()
        out: Records = {}
        for r in range(dist.get_world_size()):
            try:
                with self._lock:
                    present = store is not None and store.check([_key(r)])
                    raw = store.get(_key(r)) if present else None
                out[r] = parse_record(raw, r) if raw else None
            except Exception:
                out[r] = None
        return out

    def diagnose(self, op: str, seq: int, nbytes: int, exc: BaseException) -> CollectiveHangError | None:
        """The hang report for ``exc``, or None (the caller re-raises ``exc``): a diagnosis that fails
        itself is logged and never replaces the collective's own error."""
        rec = self.record
        if rec is None or seq == 0:
            return None
        try:
            self._publish()  # others must see that this rank reached it, even if the thread is asleep
            time.sleep(PUBLISH_INTERVAL_S * 2)  # and give theirs time to arrive
            records = self.records()
        except Exception as store_exc:
            log.warning("hang diagnosis could not read the store: %s", store_exc)
            return None
        records[rec.rank] = rec
        try:
            return self._report(op, seq, nbytes, rec, records, exc)
        except Exception as report_exc:
            log.warning("hang diagnosis failed (%s: %s); raising the collective's own error",
                        type(report_exc).__name__, report_exc)
            return None

    def _report(self, op: str, seq: int, nbytes: int, rec: Record, records: Records,
                exc: BaseException) -> CollectiveHangError:
        cause = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        message = describe(op, seq, nbytes, rec.rank, records, cause)
        ok, missing = reached(records, seq)
        report = {"op": op, "seq": seq, "bytes": nbytes, "rank": rec.rank, "cause": cause, "reached": ok,
                  "not_reached": missing, "ranks": {str(r): _as_json(v) for r, v in records.items()},
                  "time": time.time()}
        if self.run_dir:
            try:
                path = Path(self.run_dir) / f"hang-rank{rec.rank}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(report, indent=1))
                message += f" Report: {path}"
            except OSError as write_exc:
                message += f" (could not write the report: {write_exc})"
        return CollectiveHangError(message, report)


def _as_json(rec: Record | BadRecord | None) -> dict[str, Any] | None:
    if isinstance(rec, BadRecord):
        return {"bad_record": rec.reason}
    return asdict(rec) if rec is not None else None

