"""Hang diagnosis store traffic at 1,024 and 4,096 simulated ranks on one real TCPStore.

    PYTHONPATH=src python benchmarks/scale_store.py --ranks 1024,4096

The real code runs: every simulated rank is a ``Watchdog`` (its record, its ``_publish`` and ``_poll``,
the calls its watchdog thread makes once a period), and rank 0's ``HangReader`` ticks once a period in the
parent. A few driver processes, each with one store client, play the ranks' watchdog threads; every client
counts its requests. Steady phase: every rank makes progress every period (the most it can
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
import multiprocessing as mp
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from npudist.comm.hang import watchdog
from npudist.comm.hang.reader import HangReader
from npudist.comm.hang.watchdog import Record, Watchdog

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


def _drive(port: int, ranks: list[int], job: Any, phase: Any, stop: Any, out: Any, run_dir: str) -> None:
    """One driver process: each period, each of its ranks does what its watchdog thread would.

    Ranks move in lockstep as collectives force them to: the job's collective number ``job`` is set by
    the parent once a period; a rank catches up to it (enter, done), or, once ``phase`` is 1, enters the
    next call and waits there, except rank STOPPED, which neither publishes nor polls any more.
    """
    counts: collections.Counter = collections.Counter()
    client = CountingStore(dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                         timeout=timedelta(seconds=30)), counts, threading.Lock())
    wds = []
    for r in ranks:
        wd = Watchdog(run_dir=run_dir, hang_action="report")
        wd.record, wd._store = Record(rank=r), client
        wd.reader = object() if r == 0 else None  # rank 0's own poll never answers probes (its reader does)
        wds.append(wd)
    work: collections.Counter = collections.Counter()
    periods: list[float] = []
    reported = warm = False
    while not stop.value:
        start = time.monotonic()
        if not warm and phase.value == -1:  # warm-up over: count the steady state from here
            counts.clear()
            work.clear()
            warm = True
        stalled, target = phase.value == 1, job.value
        name = "stalled" if reported else "steady"
        for wd in wds:
            rec = wd.record
            if stalled and rec.rank == STOPPED:
                continue
            while rec.seq < target:
                wd.done(wd.enter("all_reduce", 4096))
                wd.step_started()
            if stalled and rec.seq == target:
                wd.enter("all_reduce", 4096)  # waits inside the call the stopped rank never reaches
            if wd._dirty.is_set():
                wd._dirty.clear()
                wd._publish()
                work[name, "publishes"] += 1
            wd._poll()
            work[name, "polls"] += 1
        periods.append(time.monotonic() - start)
        if phase.value > 0 and not reported:  # the parent takes the steady counts, then stalls the job
            out.put(("steady", dict(counts), dict(work), periods))
            counts.clear()
            work.clear()
            reported = True
        time.sleep(max(0.0, watchdog.PUBLISH_INTERVAL_S - (time.monotonic() - start)))
    out.put(("stalled", dict(counts), dict(work), periods))


def run(world: int, drivers: int, steady_s: float, deadline_s: float) -> dict[str, Any]:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    ctx = mp.get_context("fork")
    job, phase, stop = ctx.Value("i", 1), ctx.Value("i", 0), ctx.Value("i", 0)
    out = ctx.Queue()
    run_dir = tempfile.mkdtemp(prefix="scale-store-")
    procs = [ctx.Process(target=_drive, args=(server.port, list(range(world))[i::drivers], job, phase, stop, out,
                                              run_dir), daemon=True) for i in range(drivers)]
    for p in procs:
        p.start()
    counts: collections.Counter = collections.Counter()
    reader_wd = Watchdog(run_dir=run_dir, hang_action="report")
    reader_wd.record = Record(rank=0)
    reader_wd._store = CountingStore(server.clone(), counts, threading.Lock())
    reader = HangReader(reader_wd, world)
    for _ in range(3):  # warm-up: every record published once, the reader's keys created
        job.value += 1
        reader.tick()
        time.sleep(watchdog.PUBLISH_INTERVAL_S)
    counts.clear()
    phase.value = -1
    t0 = time.monotonic()
    reads = 0
    ticks: list[float] = []
    while time.monotonic() - t0 < steady_s:
        job.value += 1
        began = time.monotonic()
        reader.tick()
        ticks.append(time.monotonic() - began)
        reads += 1
        time.sleep(max(0.0, watchdog.PUBLISH_INTERVAL_S - ticks[-1]))
    # Hand-over: each driver reports its steady counts at the end of its period (the window ends there).
    phase.value = 2
    steady = [out.get(timeout=120) for _ in procs]
    steady_elapsed = time.monotonic() - t0
    steady_reader, steady_reads = dict(counts), reads
    counts.clear()
    phase.value = 1
    stalled_at = time.monotonic()
    reads = 0
    while reader.tick() is None and time.monotonic() - stalled_at < deadline_s:
        reads += 1
        time.sleep(watchdog.PUBLISH_INTERVAL_S)
    verdict_s = time.monotonic() - stalled_at if reader.verdict else None
    stop.value = 1
    stalled = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    v = reader.verdict or {}
    steady_total = sum(sum(c.values()) for _, c, _, _ in steady) + sum(steady_reader.values())
    stall_total = sum(sum(c.values()) for _, c, _, _ in stalled) + sum(counts.values())
    periodic = sum(w.get(("stalled", k), 0) for _, _, w, _ in stalled for k in ("polls", "publishes")) + reads
    periods = sorted(x for _, _, _, ps in steady for x in ps)
    return {
        "ranks": world,
        "drivers": drivers,
        "steady_requests_per_rank_per_s": steady_total / steady_elapsed / world,
        "steady_reader_requests": steady_reader,
        "steady_reads": steady_reads,
        "period_p50_s": periods[len(periods) // 2] if periods else None,
        "reader_tick_p50_s": sorted(ticks)[len(ticks) // 2],
        "named": v.get("culprits"),
        "correct": v.get("culprits") == [STOPPED],
        "seconds_to_verdict": verdict_s,
        "bound_s": v.get("bound_seconds"),
        "requests_stop_to_verdict": stall_total,
        "diagnosis_extra_requests": stall_total - periodic,
        "old_scheme_requests": 2 * world * world,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1024,4096", help="comma-separated simulated world sizes")
    p.add_argument("--drivers", type=int, default=4, help="processes (each with its own store client)")
    p.add_argument("--steady-s", type=float, default=10.0)
    p.add_argument("--deadline-s", type=float, default=120.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.ranks.split(",") if x.strip()]
    if not sizes or min(sizes) < 2 or args.drivers < 1:
        p.error("--ranks: sizes of at least 2; --drivers >= 1")
    rows = [run(n, args.drivers, args.steady_s, args.deadline_s) for n in sizes]
    print("| ranks | requests/s per rank (steady) | driver pass p50 (s) | reader tick p50 (s) | culprit named | "
          "seconds to verdict (bound) | requests stop to verdict | of which diagnosis | old scheme (2N^2) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        secs = f"{r['seconds_to_verdict']:.1f}" if r["seconds_to_verdict"] is not None else "none"
        print(f"| {r['ranks']} | {r['steady_requests_per_rank_per_s']:.2f} | {r['period_p50_s']:.2f} | "
              f"{r['reader_tick_p50_s']:.3f} | {r['named']} | {secs} ({r['bound_s']}) | "
              f"{r['requests_stop_to_verdict']} | {r['diagnosis_extra_requests']} | {r['old_scheme_requests']:,} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
