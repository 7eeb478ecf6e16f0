"""The job's one hang reader: rank 0's watchdog thread turns every rank's record into a verdict.

Each ``tick()`` (once per watchdog period) costs one ``multi_get`` of the N records. When the job has not
progressed for longer than its bound (hang.py), the reader probes the suspects (one ``set`` of their
list, one ``add`` of the control counter; each live suspect's watchdog answers with ``set`` of its
stack and ``append`` of its rank; then one ``get`` of the answers and one ``multi_get`` of the stacks),
prints one verdict line, writes ``RUN_DIR/hang-attempt{A}.json``, publishes the verdict in the store for
the other ranks, and with NPUDIST_HANG_ACTION=abort orders every live rank to exit. A diagnosis thus
costs O(N) store requests in all.

Every store call here returns at once: the records' keys are created (``compare_set``, once) before the
first ``multi_get``, the answers key before the probe, and stacks are read only for ranks whose answer
(appended after their stack was set, on the same connection) is in. So a dead or stopped rank can never
make the reader wait on the store.

Rank 0 stopped or dead takes its reader with it, so rank 1 stands by: while rank 1 itself has waited
inside one collective for longer than the bound's floor it reads the reader's heartbeat (one ``check``
and one ``get`` a period; rank 0 sets it every HEARTBEAT_EVERY_S), and only once that heartbeat is
stale and no verdict is published does it read the records and judge as rank 0 would, from the
records' own wall times (when the job last moved) and the bound rank 0 last published. A progressing
job costs the standby nothing; a stopped rank 0 is named about HEARTBEAT_STALE_S after it stopped.

At very large N one reader still reads N records a period (about 100 bytes each: 0.8 MB a second at
8,192 ranks). A tree would split that: node leaders (local rank 0) read their node's records and publish
one summary (lowest collective number, ranks behind) and rank 0 reads the summaries; the verdict logic is
the same on the summaries.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npudist.comm import hang, watchdog
from npudist.comm.watchdog import Records, parse_record

if TYPE_CHECKING:
    from npudist.comm.watchdog import Watchdog

log = logging.getLogger("npudist.comm")
ANSWER_PERIODS = 2.5
"""Watchdog periods a probe waits for answers: a live rank polls once per period."""
HEARTBEAT_EVERY_S = 5.0
"""How often rank 0's reader says it is alive (with its bound)."""
HEARTBEAT_STALE_S = 3 * HEARTBEAT_EVERY_S
"""A heartbeat older than this: rank 0's reader is stopped or gone."""


class HangReader:
    """Rank 0's reader, or (``standby``) rank 1's stand-in for it (see the module docstring)."""

    def __init__(self, wd: Watchdog, world: int, clock: Any = time.time, sleep: Any = time.sleep,
                 standby: bool = False) -> None:
        self.wd, self.world, self.clock, self.sleep, self.standby = wd, world, clock, sleep, standby
        self._beat_at = -float("inf")
        self.tracker = hang.ProgressTracker(override_s=wd.hang_timeout_s)
        self.keys = [watchdog._key(r) for r in range(world)]
        self.verdict: dict[str, Any] | None = None
        self.stalled_s = 0.0
        """Seconds without progress at the last tick (0 while progressing)."""
        self._created = False
        self._lock = threading.Lock()

    def read(self) -> Records:
        store = self.wd._connect()
        if not self._created:
            # Every record key exists from now on, so multi_get never waits for a rank that never published.
            for key in self.keys:
                store.compare_set(key, "", "")
            self._created = True
        return {r: parse_record(raw, r) if raw else None for r, raw in enumerate(store.multi_get(self.keys))}

    def tick(self) -> dict[str, Any] | None:
        """One period: read the records; on a stall past the bound, judge (and abort if so configured)."""
        if self.standby:
            return self._stand_by()
        with self._lock:
            if self.verdict is not None:
                return self.verdict
            records = self.read()
            now = self.clock()
            if now - self._beat_at >= HEARTBEAT_EVERY_S:
                self._beat_at = now
                self.wd._connect().set(heartbeat_key(), json.dumps({"time": now, "bound_s": self.tracker.bound_s}))
            stalled = self.tracker.update(now, records)
            self.stalled_s = self.tracker.stalled_for(now)
            if stalled is None:
                return None
            self._judge(records, stalled, "", recheck=True)
            if self.verdict is None:
                return None
        if self.wd.hang_action == "abort":
            self._order_abort()
        return self.verdict

    def _stand_by(self) -> dict[str, Any] | None:
        rec, now = self.wd.record, self.clock()
        if rec is None or rec.state != "entered" or now - rec.wall_time < hang.FLOOR_S:
            return None  # this rank is moving: nothing to stand in for
        store = self.wd._connect()
        beat = _heartbeat(store)
        if beat is not None and now - beat[0] < HEARTBEAT_STALE_S:
            return None  # rank 0's reader is alive: the verdict is its to give
        if store.check([watchdog.verdict_key()]):
            return None
        with self._lock:
            if self.verdict is not None:
                return self.verdict
            records = self.read()
            moved = [r.wall_time for r in records.values() if isinstance(r, watchdog.Record)]
            waiting = any(isinstance(r, watchdog.Record) and r.state == "entered" for r in records.values())
            bound = self.wd.hang_timeout_s or (beat[1] if beat is not None else hang.FLOOR_S)
            last = max(moved, default=now)
            self.stalled_s = now - last
            if not waiting or self.stalled_s <= bound:
                return None
            self.tracker.prime(records, last, bound)
            self._judge(records, self.stalled_s, "", recheck=True)
            if self.verdict is None:
                return None
        if self.wd.hang_action == "abort":
            self._order_abort()
        return self.verdict

    def judge_now(self, cause: str) -> dict[str, Any] | None:
        """A collective failed on rank 0: the verdict now, whatever the bound (no abort: the error ends it)."""
        with self._lock:
            if self.verdict is None:
                now = self.clock()
                records = self.read()
                if self.wd.record is not None:
                    records[self.wd.record.rank] = self.wd.record
                self._judge(records, self.tracker.stalled_for(now), cause)
            return self.verdict

    def _probe(self, ranks: list[int]) -> tuple[set[int], dict[int, str]]:
        """Which of ``ranks`` answer within ANSWER_PERIODS periods, and their stacks."""
        store = self.wd._connect()
        me = self.wd.record.rank if self.wd.record is not None else 0
        others = [r for r in ranks if r != me]
        answered, stacks = set(), {}
        if me in ranks:
            answered.add(me)
            stacks[me] = watchdog.main_stack()
        if not others:
            return answered, stacks
        gen = int(store.add(watchdog.ctl_key(), 0)) % watchdog.ABORT_STEP + 1
        store.set(watchdog.answers_key(gen), "")
        store.set(watchdog.want_key(), ",".join(map(str, others)))
        store.add(watchdog.ctl_key(), 1)
        self.sleep(watchdog.PUBLISH_INTERVAL_S * ANSWER_PERIODS)
        got = {int(x) for x in store.get(watchdog.answers_key(gen)).decode().split(",") if x.strip().isdigit()}
        got &= set(others)
        answered |= got
        if got:
            order = sorted(got)
            for r, raw in zip(order, store.multi_get([watchdog.stack_key(r) for r in order]), strict=True):
                stacks[r] = raw.decode(errors="replace")
        return answered, stacks

    def _judge(self, records: Records, stalled: float, cause: str, recheck: bool = False) -> None:
        found = hang.suspects(records)
        answered, stacks = self._probe(found.ranks)
        if recheck:
            # One more read after the probe: if any rank moved on meanwhile, the job was slow, not hung.
            now = self.clock()
            if self.tracker.update(now, self.read()) is None:
                return
        verdict = hang.judge(records, found, answered, stacks, now=self.clock(), stalled_s=stalled,
                             bound_s=self.tracker.bound_s, cause=cause)
        path = self._write(verdict)
        if path:
            verdict["line"] += f". Report: {path}"
        print(verdict["line"], file=sys.stderr, flush=True)
        try:
            self.wd._connect().set(watchdog.verdict_key(), json.dumps(verdict))
        except Exception as exc:
            log.debug("could not publish the hang verdict: %s", exc)
        self.verdict = verdict

    def _write(self, verdict: dict[str, Any]) -> str | None:
        if not self.wd.run_dir:
            return None
        path = Path(self.wd.run_dir) / f"hang-attempt{watchdog._attempt()}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(verdict, indent=1))
        except OSError as exc:
            verdict["line"] += f" (could not write the report: {exc})"
            return None
        return str(path)

    def _order_abort(self) -> None:
        try:
            self.wd._connect().add(watchdog.ctl_key(), watchdog.ABORT_STEP)
        finally:
            me = self.wd.record.rank if self.wd.record is not None else 0
            stand_in = " (standing in for rank 0's silent reader)" if self.standby else ""
            self.wd._abort(f"rank {me}{stand_in}: aborting the hung job (NPUDIST_HANG_ACTION=abort) so that the "
                           "launcher restarts it")


def heartbeat_key() -> str:
    return watchdog._key("reader-heartbeat")


def _heartbeat(store: Any) -> tuple[float, float] | None:
    """(wall time, bound in seconds) of rank 0's reader's last heartbeat; None if none or unreadable."""
    if not store.check([heartbeat_key()]):
        return None
    try:
        doc = json.loads(store.get(heartbeat_key()))
        beat = float(doc["time"]), float(doc["bound_s"])
    except (ValueError, TypeError, KeyError):
        return None
    return beat if all(map(math.isfinite, beat)) else None
