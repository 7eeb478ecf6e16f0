"""The job's one hang reader: rank 0's watchdog thread turns every rank's record into a verdict.

Each ``tick()`` (once per watchdog period) costs one ``multi_get`` of the N records. When the job has not
progressed for longer than its bound (hang.py), the reader probes the suspects (one ``set`` of their
list, one ``add`` of the control counter; each live suspect's watchdog answers with ``set`` of two looks
at its main thread and ``append`` of its rank; then one ``get`` of the answers and one ``multi_get`` of
the looks), puts each suspect in a state (rank_states.py), prints one verdict line and, unless every
suspect is merely busy, writes ``RUN_DIR/hang-attempt{A}.json``. While the stall lasts it looks again
every REPROBE_S and prints a new line only when a state changes; it orders every live rank to exit (with
NPUDIST_HANG_ACTION=abort) once the states' bound is reached: at once for a rank gone, stopped or out of
order, after NPUDIST_STUCK_TIMEOUT for a stuck one, never for a busy one unless NPUDIST_BUSY_TIMEOUT is
set. Progress ends the episode. A diagnosis thus costs O(N) store requests in all.

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

import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npudist.comm.hang import main_thread, process_table, watchdog
from npudist.comm.hang import store as progress_store
from npudist.diagnosis import hang, rank_states
from npudist.diagnosis.place import Place
from npudist.diagnosis.rank_states import Look
from npudist.diagnosis.record import GroupInfo, Records, parse_record, position
from npudist.diagnosis.verdict import Verdict
from npudist.runtime import compat
from npudist.runtime.env import launcher_env
from npudist.runtime.report_file import write_report

if TYPE_CHECKING:
    from npudist.comm.hang.watchdog import Watchdog

log = logging.getLogger("npudist.comm")
ANSWER_PERIODS = 3.0
"""Watchdog periods a probe waits for answers: a live rank polls once per period, then looks at its main
thread twice, rank_states.SAMPLE_GAP_S apart."""
HEARTBEAT_EVERY_S = 5.0
"""How often rank 0's reader says it is alive (with its bound)."""
HEARTBEAT_STALE_S = 3 * HEARTBEAT_EVERY_S
"""A heartbeat older than this: rank 0's reader is stopped or gone."""
REPROBE_S = 10.0
"""While a stall lasts without an abort, the suspects are looked at again this often (a busy rank may
stop, a stuck one may die)."""
GROUPS_READ = 8
"""Groups whose members a verdict reads: the groups ranks wait in (a 5-D parallel job has at most five)."""
AHEAD_LOOKED_AT = 16
"""At most this many of the ranks ahead are looked at before live ranks inside a passed call are blamed:
every rank reads the probe's list, so a probe of K ranks costs the job N x K bytes (O(1) per rank here)."""


class HangReader:
    """Rank 0's reader, or (``standby``) rank 1's stand-in for it (see the module docstring)."""

    def __init__(self, wd: Watchdog, world: int, clock: Any = time.time, sleep: Any = time.sleep,
                 standby: bool = False, processes: Callable[[Mapping[int, Place]], dict[int, str]] | None = None,
                 ) -> None:
        self.wd, self.world, self.clock, self.sleep, self.standby = wd, world, clock, sleep, standby
        self._beat_at = -float("inf")
        self.tracker = hang.ProgressTracker(override_s=wd.hang_timeout_s)
        self.keys = [progress_store._key(r) for r in range(world)]
        self.verdict: Verdict | None = None
        """The current stall's latest verdict (None while the job progresses)."""
        self._episode_since: float | None = None
        """When the stall of the current verdict began (the tracker's last progress)."""
        self._looked_at = -float("inf")
        self.stalled_s = 0.0
        """Seconds without progress at the last tick (0 while progressing)."""
        self._created = False
        self._stopped: list[int] = []
        """Pids of the current verdict's stopped ranks, seen stopped in this process table."""
        self._lock = threading.Lock()
        here = process_table.identity()
        self.processes = processes or (lambda places: process_table.local_processes(places, here))
        """What the process table says of the suspects (rank -> gone, stopped, alive), for the ranks whose pid
        means something here (process_table.py); tests inject it."""

    def read(self) -> Records:
        store = self.wd._connect()
        if not self._created:
            # Every record key exists from now on, so multi_get never waits for a rank that never published.
            for key in self.keys:
                store.compare_set(key, "", "")
            self._created = True
        return {r: parse_record(raw, r) if raw else None for r, raw in enumerate(store.multi_get(self.keys))}

    def tick(self) -> Verdict | None:
        """One period: read the records; on a stall past the bound, judge (and abort if so configured)."""
        if self.standby:
            return self._stand_by()
        with self._lock:
            records = self.read()
            now = self.clock()
            if now - self._beat_at >= HEARTBEAT_EVERY_S:
                self._beat_at = now
                self.wd._connect().set(heartbeat_key(), json.dumps({"time": now, "bound_s": self.tracker.bound_s}))
            stalled = self.tracker.update(now, records)
            self.stalled_s = self.tracker.stalled_for(now)
            if self._episode_since is not None and self.tracker._since != self._episode_since:
                self.verdict, self._episode_since = None, None  # the job moved: that stall is over
            if stalled is None:
                return None
            if self.verdict is None or now - self._looked_at >= REPROBE_S:
                self._judge(records, stalled, "", recheck=True)
                if self.verdict is None:
                    return None
            abort = self._due(stalled)
        if abort:
            self._order_abort()
        return self.verdict

    def _stand_by(self) -> Verdict | None:
        rec, now = self.wd.record, self.clock()
        if rec is None or rec.state != "entered" or now - rec.wall_time < hang.FLOOR_S:
            self.verdict = None
            return None  # this rank is moving: nothing to stand in for
        store = self.wd._connect()
        beat = _heartbeat(store)
        if beat is not None and now - beat[0] < HEARTBEAT_STALE_S:
            return None  # rank 0's reader is alive: the verdict is its to give
        if compat.store_has(store, progress_store.verdict_key()):
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
            if self.verdict is None or now - self._looked_at >= REPROBE_S:
                self.tracker.prime(records, last, bound)
                self._judge(records, self.stalled_s, "", recheck=True)
                if self.verdict is None:
                    return None
            abort = self._due(self.stalled_s)
        if abort:
            self._order_abort()
        return self.verdict

    def _due(self, stalled: float) -> bool:
        """The current verdict's states allow an abort after ``stalled`` seconds without progress."""
        after = self.verdict.abort_after_seconds if self.verdict is not None else None
        return self.wd.hang_action == "abort" and after is not None and stalled >= after

    def judge_now(self, cause: str) -> Verdict | None:
        """A collective failed on rank 0: the verdict now, whatever the bound (no abort: the error ends it)."""
        with self._lock:
            if self.verdict is None:
                now = self.clock()
                records = self.read()
                if self.wd.record is not None:
                    records[self.wd.record.rank] = self.wd.record
                self._judge(records, self.tracker.stalled_for(now), cause)
                self._publish(self.verdict)
            return self.verdict

    def _probe(self, ranks: list[int]) -> tuple[set[int], dict[int, Look]]:
        """Which of ``ranks`` answer within ANSWER_PERIODS periods, and their looks (rank_states.Look)."""
        store = self.wd._connect()
        me = self.wd.record.rank if self.wd.record is not None else 0
        others = [r for r in ranks if r != me]
        answered: set[int] = set()
        looks: dict[int, Look] = {}
        if not others:
            if me in ranks:
                answered.add(me)
                looks[me] = main_thread.look_at_main(self.wd.busy_phase, time.sleep)
            return answered, looks
        gen = int(store.add(progress_store.ctl_key(), 0)) % watchdog.ABORT_STEP + 1
        store.set(progress_store.answers_key(gen), "")
        store.set(progress_store.want_key(), ",".join(map(str, others)))
        store.add(progress_store.ctl_key(), 1)
        if me in ranks:  # this rank looks at itself while the others answer
            answered.add(me)
            mine = main_thread.look_at_main(self.wd.busy_phase, time.sleep)
            looks[me] = mine
            self.sleep(max(0.0, watchdog.PUBLISH_INTERVAL_S * ANSWER_PERIODS - mine.span_s))
        else:
            self.sleep(watchdog.PUBLISH_INTERVAL_S * ANSWER_PERIODS)
        got = {int(x) for x in store.get(progress_store.answers_key(gen)).decode().split(",") if x.strip().isdigit()}
        got &= set(others)
        answered |= got
        if got:
            order = sorted(got)
            for r, raw in zip(order, store.multi_get([progress_store.stack_key(r) for r in order]), strict=True):
                looks[r] = rank_states.parse_look(raw)
        return answered, looks

    def _ahead_dead(self, records: Records, found: hang.Suspects, answered: set[int],
                    looks: dict[int, Look]) -> tuple[hang.Suspects, set[int], dict[int, Look]]:
        """Live suspects that wait inside a call the others have left are out of order only if the others are
        alive: a rank that dies just after its record moved on (a lost node) leaves the live ones inside the
        call it never finished. The ranks ahead are then looked at too, and the silent ones are the culprits."""
        inside = [r for r in found.ranks if r in answered and isinstance(records.get(r), watchdog.Record)
                  and records[r].state == "entered" and records[r].group == found.group
                  and position(records[r], found.group) < found.top]
        if found.kind != "behind" or not inside or set(found.ranks) - answered or not found.waiting:
            return found, answered, looks
        ahead = found.waiting[:AHEAD_LOOKED_AT]
        more, more_looks = self._probe(ahead)
        if not set(ahead) - more:
            return found, answered, looks
        top = max(position(records[r], found.group) for r in inside)
        return (hang.Suspects("all_reached", sorted({*found.ranks, *ahead}), top, sorted(inside), found.group),
                answered | more, {**looks, **more_looks})

    def _waiting_dead(self, records: Records, found: hang.Suspects, answered: set[int],
                      looks: dict[int, Look]) -> tuple[hang.Suspects, set[int], dict[int, Look]]:
        """The mirror of _ahead_dead: live ranks past the call the others wait in skipped it only if those
        others are alive. A node cut off just after it finished the call cannot publish that it left it, so
        the live ranks that went on look ahead of it. The waiting ranks are looked at too (at most
        AHEAD_LOOKED_AT), and the silent ones are the culprits."""
        if found.kind != "ahead" or set(found.ranks) - answered or not found.waiting:
            return found, answered, looks
        waiting = found.waiting[:AHEAD_LOOKED_AT]
        more, more_looks = self._probe(waiting)
        if not set(waiting) - more:
            return found, answered, looks
        return (hang.Suspects("all_reached", sorted({*found.ranks, *waiting}), found.top, sorted(found.ranks),
                              found.group),
                answered | more, {**looks, **more_looks})

    def _node_mates(self, records: Records, found: hang.Suspects, answered: set[int],
                    looks: dict[int, Look]) -> tuple[hang.Suspects, set[int], dict[int, Look]]:
        """A node lost as a whole can leave some of its ranks' records inside the call the others wait in
        (they entered it before the node died) and others behind it: the waiting ranks on the host of a
        silent suspect (torchrun's node = a block of LOCAL_WORLD_SIZE ranks, confirmed by the host each
        published) are looked at too, and the silent ones join the culprits. O(ranks per node)."""
        silent = [r for r in found.ranks if r not in answered]
        per_node = launcher_env(os.environ).local_world_size or 0
        if found.kind != "behind" or not silent or not found.waiting or per_node < 2:
            return found, answered, looks
        blocks = {r // per_node for r in silent}
        near = [r for r in found.waiting if r // per_node in blocks]
        who = progress_store.read_who(self.wd._connect(), silent[:progress_store.WHO_AT_MOST // 2] + near)
        hosts = {who[r][0] for r in silent if r in who}
        mates = [r for r in near if r in who and who[r][0] in hosts]
        if not mates:
            return found, answered, looks
        more, more_looks = self._probe(mates)
        gone = set(mates) - more
        if not gone:
            return found, answered, looks
        return (hang.Suspects("behind", sorted({*found.ranks, *gone}), found.top,
                              [r for r in found.waiting if r not in gone], found.group),
                answered | more, {**looks, **more_looks})

    def _judge(self, records: Records, stalled: float, cause: str, recheck: bool = False) -> None:
        infos = self._groups(records)
        found = hang.suspects(records, {g: info.ranks for g, info in infos.items()})
        answered, looks = self._probe(found.ranks)
        found, answered, looks = self._ahead_dead(records, found, answered, looks)
        found, answered, looks = self._waiting_dead(records, found, answered, looks)
        found, answered, looks = self._node_mates(records, found, answered, looks)
        self._looked_at = self.clock()
        if recheck:
            # One more read after the probe: if any rank moved on meanwhile, the job was slow, not hung.
            now = self.clock()
            if self.tracker.update(now, self.read()) is None:
                self.verdict, self._episode_since = None, None
                return
        places = progress_store.read_places(self.wd._connect(), found.ranks)
        verdict = hang.judge(records, found, answered, looks, now=self.clock(), stalled_s=stalled,
                             bound_s=self.tracker.bound_s, cause=cause, who=places,
                             processes=(processes := self.processes(places)),
                             stuck_s=self.wd.stuck_timeout_s, busy_s=self.wd.busy_timeout_s,
                             action=self.wd.hang_action, group=infos.get(found.group))
        self._stopped = [pid for r, st in verdict.states.items()
                         if st == rank_states.STOPPED and processes.get(r) == rank_states.PROCESS_STOPPED
                         and (pid := places.get(r, Place()).pid)]
        if self.verdict is not None and verdict.states == self.verdict.states and not cause:
            self.verdict = replace(self.verdict, stalled_seconds=stalled)  # same states: nothing new to say
            return
        first_time = verdict.time if self.verdict is None else (self.verdict.first_time or verdict.time)
        verdict = replace(verdict, first_time=first_time)
        silent = rank_states.STARVED in verdict.states.values()  # busy or cut off: said, and kept on file
        if not verdict.busy_only or silent:
            verdict = replace(verdict, line=verdict.line + self._write(verdict))
        print(verdict.line, file=sys.stderr, flush=True)
        self.verdict = verdict
        self._episode_since = self.tracker._since
        if verdict.abort_after_seconds == 0:  # final: the failing ranks' errors and the standby read it
            self._publish(verdict)

    def _groups(self, records: Records) -> dict[str, GroupInfo]:
        """The members of the groups some rank waits in, as published: one ``check`` and one ``get`` per group,
        at most GROUPS_READ of them."""
        store = self.wd._connect()
        infos = {}
        for name in hang.waiting_groups(records)[:GROUPS_READ]:
            info = progress_store.read_group(store, name)
            if info is not None:
                infos[name] = info
        return infos

    def _publish(self, verdict: Verdict | None) -> None:
        """The verdict, for the ranks whose collective fails or who are ordered to exit."""
        if verdict is None:
            return
        try:
            self.wd._connect().set(progress_store.verdict_key(), json.dumps(verdict.to_json()))
        except Exception as exc:
            log.debug("could not publish the hang verdict: %s", exc)

    def _write(self, verdict: Verdict) -> str:
        """The verdict into the run directory; what its line says of that (nothing without a run directory)."""
        if not self.wd.run_dir:
            return ""
        path = Path(self.wd.run_dir) / f"hang-attempt{progress_store._attempt()}.json"
        try:
            write_report(path, json.dumps(verdict.to_json(), indent=1))
        except OSError as exc:
            return f" (could not write the report: {exc})"
        return f". Report: {path}"

    def _order_abort(self) -> None:
        # A stopped rank in this process table can never exit on the order; ended here, torchrun sees it go
        # at once instead of waiting out its SIGTERM grace period on a process that cannot run its handler.
        for pid in self._stopped:
            if pid != os.getpid() and process_table.status_of(pid) == rank_states.PROCESS_STOPPED:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        self._publish(self.verdict)
        try:
            self.wd._connect().add(progress_store.ctl_key(), watchdog.ABORT_STEP)
        finally:
            me = self.wd.record.rank if self.wd.record is not None else 0
            stand_in = " (standing in for rank 0's silent reader)" if self.standby else ""
            said = self.verdict
            self.wd._abort(f"rank {me}{stand_in}: aborting the hung job (NPUDIST_HANG_ACTION=abort)",
                           verdict_line=said.line if said else None, verdict_time=said.time if said else None)


def heartbeat_key() -> str:
    return progress_store._key("reader-heartbeat")


def _heartbeat(store: Any) -> tuple[float, float] | None:
    """(wall time, bound in seconds) of rank 0's reader's last heartbeat; None if none or unreadable."""
    if not compat.store_has(store, heartbeat_key()):
        return None
    try:
        doc = json.loads(store.get(heartbeat_key()))
        beat = float(doc["time"]), float(doc["bound_s"])
    except (ValueError, TypeError, KeyError):
        return None
    return beat if all(map(math.isfinite, beat)) else None
