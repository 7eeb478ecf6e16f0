"""Hang diagnosis store traffic at 1,024 and 4,096 simulated ranks on one real TCPStore.

    PYTHONPATH=src python benchmarks/scale_store.py --ranks 1024,4096

The real code runs: every simulated rank is a ``Watchdog`` (its record, its ``_publish`` and ``_poll``,
the calls its watchdog thread makes once a period), and rank 0's ``HangReader`` runs in its own thread as
in a job. A few driver threads, each with its own store client, play the ranks' watchdog threads; every
client counts its requests. Steady phase: every rank makes progress every period (the most it can
publish). Then one rank stops (SIGSTOP-like: neither publishes nor polls) and the others wait inside the
next collective; the reader must name it. Reported: store requests a second per rank (steady), requests
from the stop to the verdict and how many of them the diagnosis itself added, and seconds to the verdict
(bound included: NPUDIST_HANG_TIMEOUT's default deduction, at least comm/hang.py's FLOOR_S).

The old scheme (every failing rank does ``check`` + ``get`` of every record) costs 2 N^2 requests: shown
beside, computed.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from npudist.comm import watchdog
from npudist.comm.hang_reader import HangReader
from npudist.comm.watchdog import Record, Watchdog

STOPPED = 1


class CountingStore:
    """A store client that counts its requests by method: what the store server has to serve."""

    def __init__(self, inner: dist.Store, counts: collections.Counter, lock: threading.Lock) -> None:
        self.inner, self.counts, self.lock = inner, counts, lock

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.inner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.counts[name] += 1
            return fn(*args, **kwargs)

        return call


def _drive(ranks: list[Watchdog], stop: threading.Event, phase: dict[str, str], periods: list[float],
           work: collections.Counter) -> None:
    """One driver thread: each period, each of its ranks does what its watchdog thread would."""
    while not stop.is_set():
        start = time.monotonic()
        polls = publishes = 0
        stalled = phase["name"] == "stalled"
        for wd in ranks:
            rank = wd.record.rank
            if stalled and rank == STOPPED:
                continue
            if not stalled:
                wd.done(wd.enter("all_reduce", 4096))
                wd.step_started()
            elif wd.record.state != "entered":
                wd.enter("all_reduce", 4096)  # waits inside the call the stopped rank never reaches
            if wd._dirty.is_set():
                wd._dirty.clear()
                wd._publish()
                publishes += 1
            wd._poll()
            polls += 1
        work[phase["name"], "polls"] += polls
        work[phase["name"], "publishes"] += publishes
        took = time.monotonic() - start
        periods.append(took)
        stop.wait(max(0.0, watchdog.PUBLISH_INTERVAL_S - took))


def run(world: int, drivers: int, steady_s: float, deadline_s: float) -> dict[str, Any]:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()
    clients = [CountingStore(server.clone(), counts, lock) for _ in range(drivers + 1)]
    run_dir = tempfile.mkdtemp(prefix="scale-store-")
    ranks = []
    for r in range(world):
        wd = Watchdog(run_dir=run_dir, hang_action="report")
        wd.record = Record(rank=r)
        wd._store = clients[r % drivers]
        ranks.append(wd)
    reader_wd = ranks[0]
    reader = HangReader(reader_wd, world)
    reader_wd.reader = reader
    reader_client = clients[drivers]
    reader_wd_view = Watchdog(run_dir=run_dir, hang_action="report")  # the reader's own client
    reader_wd_view.record, reader_wd_view._store = reader_wd.record, reader_client
    reader.wd = reader_wd_view
    phase = {"name": "steady"}
    stop = threading.Event()
    periods: list[float] = []
    work: collections.Counter = collections.Counter()
    threads = [threading.Thread(target=_drive, args=(ranks[i::drivers], stop, phase, periods, work), daemon=True)
               for i in range(drivers)]
    verdict_at: list[float] = []

    def read() -> None:
        while not stop.is_set():
            work[phase["name"], "reads"] += 1
            if reader.tick() is not None:
                verdict_at.append(time.monotonic())
                return
            stop.wait(watchdog.PUBLISH_INTERVAL_S)

    reader_thread = threading.Thread(target=read, daemon=True)
    for t in threads:
        t.start()
    reader_thread.start()
    time.sleep(2 * watchdog.PUBLISH_INTERVAL_S)  # the first records exist
    with lock:
        counts.clear()
    t0 = time.monotonic()
    time.sleep(steady_s)
    with lock:
        steady = dict(counts)
        counts.clear()
    steady_elapsed = time.monotonic() - t0
    steady_periods = list(periods)
    phase["name"] = "stalled"
    stalled_at = time.monotonic()
    reader_thread.join(deadline_s)
    stop.set()
    for t in threads:
        t.join(30)
    with lock:
        stall = dict(counts)
    elapsed = time.monotonic() - stalled_at
    v = reader.verdict or {}
    # What the ranks' periodic calls cost over the same time (polls, publishes, the reader's multi_gets).
    periodic = sum(work["stalled", k] for k in ("polls", "publishes", "reads"))
    return {
        "ranks": world,
        "drivers": drivers,
        "steady_requests_per_rank_per_s": sum(steady.values()) / steady_elapsed / world,
        "steady_by_call": steady,
        "period_p50_s": sorted(steady_periods)[len(steady_periods) // 2] if steady_periods else None,
        "named": v.get("culprits"),
        "correct": v.get("culprits") == [STOPPED],
        "seconds_to_verdict": (verdict_at[0] - stalled_at) if verdict_at else None,
        "bound_s": v.get("bound_seconds"),
        "requests_stop_to_verdict": sum(stall.values()),
        "stall_by_call": stall,
        "diagnosis_extra_requests": sum(stall.values()) - periodic,
        "old_scheme_requests": 2 * world * world,
        "elapsed_s": elapsed,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1024,4096", help="comma-separated simulated world sizes")
    p.add_argument("--drivers", type=int, default=4, help="threads (each with its own store client)")
    p.add_argument("--steady-s", type=float, default=10.0)
    p.add_argument("--deadline-s", type=float, default=120.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.ranks.split(",") if x.strip()]
    if not sizes or min(sizes) < 2 or args.drivers < 1:
        p.error("--ranks: sizes of at least 2; --drivers >= 1")
    rows = [run(n, args.drivers, args.steady_s, args.deadline_s) for n in sizes]
    print("| ranks | requests/s per rank (steady) | period p50 (s) | culprit named | seconds to verdict "
          "(bound) | requests stop to verdict | of which diagnosis | old scheme (2N^2) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        secs = f"{r['seconds_to_verdict']:.1f}" if r["seconds_to_verdict"] is not None else "none"
        print(f"| {r['ranks']} | {r['steady_requests_per_rank_per_s']:.2f} | {r['period_p50_s']:.2f} | "
              f"{r['named']} | {secs} ({r['bound_s']}) | {r['requests_stop_to_verdict']} | "
              f"{r['diagnosis_extra_requests']} | {r['old_scheme_requests']:,} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
