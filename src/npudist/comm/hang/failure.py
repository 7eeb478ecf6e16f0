"""A collective that failed (a timeout, a peer gone): the error that names who never reached it.

The failing rank raises CollectiveHangError instead of the backend's bare error: the op, its number on its
group, the ranks that had and had not reached it (from every rank's published record), where the missing
ones run, and rank 0's verdict when there is one. The report goes to the run directory as
``hang-rank<R>.json``. The watchdog (watchdog.py) gathers what this needs from the store.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npudist.comm.hang.store import read_group, read_who, wait_for_verdict
from npudist.diagnosis.record import BadRecord, Record, Records, position, record_json
from npudist.runtime.report_file import write_report

log = logging.getLogger("npudist.comm")
NATIVE = -1
"""What enter() returns while the process-group watch (pg_watch.py) numbers every call: nothing to mark."""


class CollectiveHangError(RuntimeError):
    """A collective did not complete; the message names the ranks that never reached it."""

    def __init__(self, message: str, report: dict[str, Any]) -> None:
        super().__init__(message)
        self.report = report


def reached(records: Records, seq: int, group: str = "",
            members: tuple[int, ...] | None = None) -> tuple[list[int], list[int]]:
    """Ranks whose record shows they entered collective ``seq`` of ``group`` (or a later one), and the rest of
    the group's members (every rank when the members are not known)."""
    ranks = [r for r in records if members is None or r in members]
    got = sorted(r for r in ranks if isinstance(records[r], Record) and position(records[r], group) >= seq)
    return got, sorted(r for r in ranks if r not in got)


def _last_seen(r: int, rec: Record | BadRecord | None, now: float) -> str:
    if isinstance(rec, BadRecord):
        return f"rank {r}: bad record in the store ({rec.reason})"
    if rec is None or rec.seq == 0:
        return f"rank {r}: never reported"
    number = rec.gseq if rec.group else rec.seq  # on the failing call's group, which the message names
    return f"rank {r}: last {rec.op} #{number} ({rec.state}, {now - rec.wall_time:.1f} s ago)"


def describe(op: str, seq: int, nbytes: int, rank: int, records: Records, cause: str, group: str = "",
             members: tuple[int, ...] | None = None) -> str:
    ok, missing = reached(records, seq, group, members)
    now = time.time()
    last = [_last_seen(r, records.get(r), now) for r in missing]
    who = (f"rank(s) {', '.join(map(str, missing))} never reached it ({'; '.join(last)})" if missing
           else "every rank reached it (a slow link or a peer that died inside it)")
    on = f" of group {group}" if group else ""
    return (f"{op} #{seq}{on} ({nbytes} bytes) failed on rank {rank}: {cause}. Ranks {', '.join(map(str, ok))} "
            f"reached it; {who}. Check the missing ranks' logs, hosts and devices first.")


def failure_error(*, op: str, seq: int, nbytes: int, rank: int, records: Records, cause: str,
                  verdict: Mapping[str, Any] | None, group: str, members: tuple[int, ...] | None,
                  where: Mapping[int, tuple[str, int]], run_dir: str | None) -> CollectiveHangError:
    """The error rank ``rank`` raises for call ``seq`` of ``group``; ``verdict``: rank 0's verdict as published
    (its JSON), ``where``: (host, pid) of the ranks that never reached it, as they published it."""
    message = describe(op, seq, nbytes, rank, records, cause, group, members)
    ok, missing = reached(records, seq, group, members)
    report = {"op": op, "seq": seq, "group": group, "bytes": nbytes, "rank": rank, "cause": cause,
              "reached": ok, "not_reached": missing, "ranks": {str(r): record_json(v) for r, v in records.items()},
              "where": {str(r): {"host": h, "pid": p} for r, (h, p) in where.items()}, "time": time.time()}
    if where:
        message += " Where: " + ", ".join(f"rank {r} on {h} pid {p}" for r, (h, p) in sorted(where.items())) + "."
    line = verdict.get("line") if verdict is not None else None
    if isinstance(line, str):
        message += f" Rank 0's verdict: {line}"
        report["verdict"] = dict(verdict)
    if run_dir:
        try:
            path = write_report(Path(run_dir) / f"hang-rank{rank}.json", json.dumps(report, indent=1))
            message += f" Report: {path}"
        except OSError as write_exc:
            message += f" (could not write the report: {write_exc})"
    return CollectiveHangError(message, report)


def diagnose(wd: Any, *, op: str, seq: int, nbytes: int, exc: BaseException, period_s: float,
             verdict_wait_s: float) -> CollectiveHangError | None:
    """The error for ``exc`` on the rank of ``wd`` (its Watchdog, which calls this), or None (the caller
    re-raises ``exc``): a diagnosis that fails itself is logged and never replaces the collective's own error.
    ``period_s``: the watchdog's publish period; ``verdict_wait_s``: how long to wait for rank 0's verdict."""
    rec = wd.record
    if rec is None or seq == 0:
        return None
    cause = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    try:
        if seq == NATIVE:
            wd.refresh()
        wd._publish()  # others must see that this rank reached it, even if the thread is asleep
        verdict = None
        if wd.reader is not None:
            said = wd.reader.judge_now(cause)
            verdict = said.to_json() if said is not None else None
        elif rec.rank != 0 and wd.hang_action != "off":
            verdict = wait_for_verdict(wd._connect(), verdict_wait_s, period_s / 2)
        if verdict is None:
            time.sleep(period_s * 2)  # give the others' records time to arrive
        records = wd.records()
    except Exception as store_exc:
        log.warning("hang diagnosis could not read the store: %s", store_exc)
        return None
    records[rec.rank] = rec
    try:
        return report(wd, op=op, seq=seq, nbytes=nbytes, records=records, cause=cause, verdict=verdict)
    except Exception as report_exc:
        log.warning("hang diagnosis failed (%s: %s); raising the collective's own error",
                    type(report_exc).__name__, report_exc)
        return None


def report(wd: Any, *, op: str, seq: int, nbytes: int, records: Records, cause: str,
           verdict: Mapping[str, Any] | None) -> CollectiveHangError:
    """The error for call ``seq`` (NATIVE: the one the record says the rank waits in, on its group)."""
    rec = wd.record
    assert rec is not None
    group, members = "", None
    if seq == NATIVE:
        group, seq = rec.group, rec.gseq
        info = read_group(wd._connect(), group)
        members = info.ranks if info is not None else None
    _, missing = reached(records, seq, group, members)
    return failure_error(op=op, seq=seq, nbytes=nbytes, rank=rec.rank, records=records, cause=cause,
                         verdict=verdict, group=group, members=members, where=read_who(wd._connect(), missing),
                         run_dir=wd.run_dir)
