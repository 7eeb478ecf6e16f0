"""Hang verdicts: the pure tracker and judge, and the reader against a real TCPStore that counts requests."""

from __future__ import annotations

import collections
import json
import math
import os
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from npudist.comm.hang import main_thread, watchdog
from npudist.comm.hang import store as progress_store
from npudist.comm.hang.reader import HangReader
from npudist.comm.hang.watchdog import Record, Watchdog
from npudist.diagnosis import hang
from npudist.diagnosis.hang import ProgressTracker, judge, suspects
from npudist.diagnosis.rank_states import Look


def rec(rank: int, seq: int, state: str = "done", op: str = "all_reduce", nbytes: int = 64, step: int = 1,
        t: float = 0.0) -> Record:
    return Record(rank=rank, seq=seq, step=step, op=op, nbytes=nbytes, state=state, wall_time=t)


def test_a_rank_below_the_others_is_behind():
    records = {0: rec(0, 9, "entered"), 1: rec(1, 8), 2: rec(2, 9, "entered"), 3: None}
    found = suspects(records)
    assert (found.kind, found.ranks, found.top, found.waiting) == ("behind", [1, 3], 9, [0, 2])


def test_a_rank_past_the_call_the_others_wait_in_skipped_one():
    records = {r: rec(r, 6, "entered", nbytes=4) for r in range(4)}
    records[2] = rec(2, 7, "entered", nbytes=4096)
    found = suspects(records)
    assert (found.kind, found.ranks, found.top) == ("ahead", [2], 6)
    verdict = judge(records, found, {2}, {}, now=1.0, stalled_s=11.0, bound_s=10.0)
    assert "rank(s) 2 ran past it" in verdict.line and verdict.not_reached == ()


def test_two_ranks_out_of_step_blame_the_one_below():
    assert suspects({0: rec(0, 6, "entered"), 1: rec(1, 5)}).ranks == [1]


def test_a_different_op_or_size_at_the_same_number_is_a_mismatch():
    records = {r: rec(r, 5, "entered") for r in range(5)}
    records[3] = rec(3, 5, "entered", nbytes=128)
    found = suspects(records)
    assert (found.kind, found.ranks, found.waiting) == ("mismatch", [3], [0, 1, 2, 4])
    records[3] = rec(3, 5, "entered", op="ddp_forward", nbytes=0)
    assert suspects(records).ranks == [3]


def test_when_every_rank_is_inside_the_same_call_the_silent_one_is_named():
    records = {r: rec(r, 7, "entered") for r in range(4)}
    found = suspects(records)
    assert found.kind == "all_reached" and found.ranks == [0, 1, 2, 3]
    verdict = judge(records, found, {0, 1, 3}, {}, now=10.0, stalled_s=12.0, bound_s=10.0)
    assert verdict.culprits == (2,) and verdict.not_reached == ()
    assert "rank 2 inside all_reduce #7" in verdict.line and "did not answer" in verdict.line
    alive = judge(records, found, {0, 1, 2, 3}, {}, now=10.0, stalled_s=12.0, bound_s=10.0)
    assert alive.culprits == () and "every rank is alive" in alive.line


def test_the_verdict_names_the_behind_rank_its_last_call_and_its_stack():
    records = {0: rec(0, 9, "entered", t=1.0), 1: rec(1, 8, t=2.0, step=4), 2: rec(2, 9, "entered", t=1.0)}
    stack = '  File "train.py", line 7, in main\n    step()\n  File "train.py", line 3, in step\n    sleep(9)\n'
    verdict = judge(records, suspects(records), {1}, {1: stack}, now=12.0, stalled_s=11.0, bound_s=10.0)
    line = verdict.line
    assert line.startswith("npudist hang: no progress for 11.0 s (bound 10.0 s); ranks 0, 2 wait in all_reduce #9")
    assert "rank(s) 1 never reached it: rank 1 after all_reduce #8 (64 bytes, step 4, 10.0 s ago)" in line
    assert "answered: live but stuck" in line and 'File "train.py", line 3, in step' in line
    assert verdict.not_reached == (1,) and verdict.reached == (0, 2)
    assert verdict.culprit_ranks[1].stack == stack
    json.dumps(verdict.to_json())  # the report is JSON as it stands


def test_a_verdict_at_scale_lists_a_few_ranks_in_its_line_and_all_in_the_report():
    records = {r: rec(r, 3, "entered") for r in range(8192)}
    for r in range(100, 120):
        records[r] = rec(r, 2)
    verdict = judge(records, suspects(records), set(), {}, now=1.0, stalled_s=11.0, bound_s=10.0)
    assert verdict.culprits == tuple(range(100, 120)) and "and 12 more" in verdict.line
    assert len(verdict.line) < 2000


def test_a_culprits_card_is_named_with_its_vendors_health_command_only_when_known():
    from npudist.diagnosis.place import Place

    records = {0: rec(0, 9, "entered"), 1: rec(1, 8), 2: rec(2, 9, "entered"), 3: rec(3, 8)}
    who = {1: Place(host="n2", pid=77, local_rank=1, accelerator="npu", card=5, chip=1),
           3: Place(host="n2", pid=78, local_rank=3, accelerator="npu")}  # its physical card is not known
    verdict = judge(records, suspects(records), set(), {}, now=1.0, stalled_s=11.0, bound_s=10.0, who=who)
    one, three = verdict.culprit_ranks[1], verdict.culprit_ranks[3]
    assert one.next_commands == ("py-spy dump --pid 77 (on n2)", "npu-smi info -t health -i 5 -c 1 (on n2)")
    assert three.next_commands == ("py-spy dump --pid 78 (on n2)",)  # a logical index would name another card
    assert (one.place.accelerator, one.place.card, one.place.chip, three.place.local_rank) == ("npu", 5, 1, 3)
    in_file = verdict.to_json()["culprit_ranks"]["1"]  # the report's shape, which npudist diagnose reads
    assert (in_file["host"], in_file["card"], in_file["next_commands"][0]) == ("n2", 5, "py-spy dump --pid 77 (on n2)")


def test_the_bound_comes_from_the_job_and_has_a_floor_and_an_override():
    t = ProgressTracker()
    records = {0: rec(0, 1, "entered", step=0), 1: rec(1, 1, "entered", step=0)}
    assert t.update(0.0, records) is None
    # start-up: 50 s before the first step is forgotten once steps begin
    records = {0: rec(0, 2, "entered", step=1), 1: rec(1, 2, "entered", step=1)}
    assert t.update(50.0, records) is None
    for i in range(3, 20):
        records = {0: rec(0, i, "entered", step=i), 1: rec(1, i, "entered", step=i)}
        assert t.update(50.0 + 2 * (i - 2), records) is None
    assert t.bound_s == pytest.approx(hang.FLOOR_S)
    now = 50.0 + 2 * 17
    assert t.update(now + 9.0, records) is None
    assert t.update(now + 10.5, records) == pytest.approx(10.5)
    # slow steps raise the bound: 3 x the longest interval
    t.update(now + 11.0, {0: rec(0, 30, "entered", step=30), 1: rec(1, 30, "entered", step=30)})
    assert t.bound_s == pytest.approx(3 * 11.0)
    assert ProgressTracker(override_s=2.0).bound_s == 2.0


def test_ranks_that_all_compute_are_not_hung():
    t = ProgressTracker()
    records = {0: rec(0, 4), 1: rec(1, 4)}
    t.update(0.0, records)
    assert t.update(1000.0, records) is None
    assert t.update(1000.0, {0: rec(0, 5, "entered"), 1: rec(1, 4)}) is None


class CountingStore:
    """A store client that counts its requests by method (what the job's store server would serve)."""

    def __init__(self, inner: dist.Store) -> None:
        self.inner, self.calls = inner, collections.Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name):
        fn = getattr(self.inner, name)

        def call(*args, **kwargs):
            with self._lock:
                self.calls[name] += 1
            return fn(*args, **kwargs)

        return call

    def total(self) -> int:
        return sum(self.calls.values())


@pytest.fixture
def store():
    if not hasattr(dist.TCPStore, "clone"):
        pytest.skip("the tests' store clients use TCPStore.clone() (torch >= 2.8)")
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    yield server


def _watchdog(rank: int, client, **kw) -> Watchdog:
    wd = Watchdog(hang_action="report", **kw)
    wd.record = Record(rank=rank)
    wd._store = client
    return wd


@pytest.mark.parametrize("world", [16, 128])
def test_a_diagnosis_costs_o_n_store_requests(store, world, monkeypatch, tmp_path):
    monkeypatch.setattr(watchdog, "PUBLISH_INTERVAL_S", 0.01)
    monkeypatch.setenv("LOCAL_RANK", "3")  # what torchrun sets; every rank of this test shares it
    client = CountingStore(store.clone())
    ranks = [_watchdog(r, client, run_dir=str(tmp_path)) for r in range(world)]
    clock = [time.time()]
    reader = HangReader(ranks[0], world, clock=lambda: clock[0], sleep=lambda s: [wd._poll() for wd in ranks[1:]
                                                                                  if wd.record.rank != 5],
                        processes=lambda places: {})  # the ranks are on other hosts: no process table to look in
    ranks[0].reader = reader
    for _ in range(3):
        for wd in ranks:
            seq = wd.enter("all_reduce", 64)
            wd.step_started()
            wd.done(seq)
            wd._publish()
        clock[0] += 1.0
        assert reader.tick() is None
    for wd in ranks:
        if wd.record.rank != 5:  # rank 5 stops; the others wait inside the next call
            wd.enter("all_reduce", 64)
            wd._publish()
    client.calls.clear()
    ticks = 0
    while ticks < 12:
        ticks += 1
        clock[0] += 1.0
        if reader.tick() is not None:
            break
        for wd in ranks[1:]:
            if wd.record.rank != 5:
                wd._poll()
    verdict = reader.verdict
    assert verdict is not None and verdict.culprits == (5,) and verdict.not_reached == (5,)
    assert verdict.culprit_ranks[5].alive is False
    # Steady: one multi_get a tick and one poll per rank a tick. The diagnosis: every rank reads the probe's
    # list once, and a handful of calls for the probe and the verdict (one check and one multi_get of where the
    # culprits run). O(N) in all, never N^2.
    assert client.calls["multi_get"] <= ticks + 2 and client.calls["check"] <= 1
    assert client.total() <= ticks * world + 2 * world + 20, client.calls
    saved = json.loads((tmp_path / "hang-attempt0.json").read_text())
    assert saved["culprits"] == [5] and "rank(s) 5 never reached it" in saved["line"]
    # The file says where the culprit runs, as it published itself, and what to run there next.
    here, pid = socket.gethostname(), os.getpid()
    five = saved["culprit_ranks"]["5"]
    assert (five["host"], five["pid"], five["local_rank"]) == (here, pid, 3)
    assert five["next_commands"][0] == f"py-spy dump --pid {pid} (on {here})"
    assert f"({here} pid {pid}, local rank 3)" in saved["line"] and f"next: py-spy dump --pid {pid}" in saved["line"]
    assert saved["iso_time"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(saved["time"]))


def _one_behind(ranks: list[Watchdog], behind: int, next_op: str) -> None:
    """Every rank enters call 1; all but ``behind`` finish it and wait in call 2 (``next_op``)."""
    for wd in ranks:
        seq = wd.enter("all_reduce", 8)
        if wd.record.rank != behind:
            wd.done(seq)
            wd.enter(next_op, 8)
        wd._publish()


def test_a_live_suspect_answers_with_its_stack(store, monkeypatch):
    monkeypatch.setattr(watchdog, "PUBLISH_INTERVAL_S", 0.01)
    client = CountingStore(store.clone())
    ranks = [_watchdog(r, client) for r in range(3)]
    reader = HangReader(ranks[0], 3, sleep=lambda s: ranks[1]._poll() or ranks[2]._poll())
    _one_behind(ranks, 1, "all_reduce")
    records = reader.read()
    reader._judge(records, 11.0, "")
    verdict = reader.verdict
    assert verdict.culprits == (1,) and verdict.culprit_ranks[1].alive is True
    assert "test_hang.py" in verdict.culprit_ranks[1].stack  # this test's main thread
    assert math.isclose(verdict.stalled_seconds, 11.0)


def test_the_stall_gauge_is_exported_where_a_reader_runs():
    from npudist.telemetry.exposition.collector_health import CollectorHealth
    from npudist.telemetry.job.comm_metrics import CommCollector

    labels = ["0", "0", "n", "cpu", "0", "r1"]
    fams = {f.name: f for f in CommCollector(CollectorHealth(), labels, stats=lambda: type("S", (), {"ops": ()})(),
                                             stall=lambda: 12.5).collect()}
    assert [s.value for s in fams["npudist_hang_stall_seconds"].samples] == [12.5]
    for bad in (None, float("nan"), -1.0, "x"):
        fams = {f.name for f in CommCollector(CollectorHealth(), labels, stats=lambda: type("S", (), {"ops": ()})(),
                                              stall=lambda b=bad: b).collect()}
        assert "npudist_hang_stall_seconds" not in fams


def test_rank_0_behind_is_judged_by_its_own_reader_without_a_store_probe(store, monkeypatch):
    monkeypatch.setattr(watchdog, "PUBLISH_INTERVAL_S", 0.01)
    client = CountingStore(store.clone())
    ranks = [_watchdog(r, client) for r in range(3)]
    reader = HangReader(ranks[0], 3, sleep=lambda s: pytest.fail("no probe needed"))
    _one_behind(ranks, 0, "broadcast")
    ranks[0].done(ranks[0].record.seq)  # it left call 1 too, and is late for call 2 (not inside a passed call)
    ranks[0]._publish()
    client.calls.clear()  # the ranks' start-up publishing (their timeouts' arrival count is an add) is no probe
    reader._judge(reader.read(), 12.0, "")
    verdict = reader.verdict
    assert verdict.culprits == (0,) and verdict.culprit_ranks[0].alive is True
    assert "rank(s) 0 never reached it" in verdict.line and "broadcast #2" in verdict.line
    assert client.calls["add"] == 0


def test_a_live_rank_left_inside_a_call_has_the_ranks_ahead_looked_at_before_it_is_blamed(store, monkeypatch):
    monkeypatch.setattr(watchdog, "PUBLISH_INTERVAL_S", 0.01)
    client = CountingStore(store.clone())
    ranks = [_watchdog(r, client) for r in range(3)]
    asleep = Look(stack='  File "train.py", line 3, in step\n', cpu_s=0.0, span_s=0.5)
    monkeypatch.setattr(main_thread, "look_at_main", lambda busy, wait: asleep)
    reader = HangReader(ranks[0], 3, sleep=lambda s: ranks[1]._poll() or ranks[2]._poll())
    _one_behind(ranks, 0, "broadcast")
    reader._judge(reader.read(), 12.0, "")
    verdict = reader.verdict
    assert verdict.culprits == (0,) and verdict.states == {0: "out_of_order"}  # the others answered
    assert client.calls["add"] > 0


def test_ranks_that_went_on_are_not_blamed_when_the_ranks_they_passed_are_silent(store, monkeypatch):
    """A node cut off (a partition) just after finishing call 1 cannot publish that it left it: its ranks 2, 3
    still read "inside call 1" while the live ranks 0, 1 went on to calls 3 and 2. They look ahead (a skipped
    call) until the ranks they passed are probed: those do not answer, so they are the culprits."""
    monkeypatch.setattr(watchdog, "PUBLISH_INTERVAL_S", 0.01)
    client = CountingStore(store.clone())
    ranks = [_watchdog(r, client) for r in range(4)]
    reader = HangReader(ranks[0], 4, sleep=lambda s: ranks[1]._poll())  # 2 and 3 never answer
    for wd in ranks:
        seq = wd.enter("all_reduce", 8)
        for _ in range({0: 2, 1: 1}.get(wd.record.rank, 0)):
            wd.done(seq)
            seq = wd.enter("all_reduce", 8)
        wd._publish()
    assert hang.suspects(reader.read()).kind == "ahead"  # what the records alone say
    reader._judge(reader.read(), 12.0, "")
    verdict = reader.verdict
    assert verdict.culprits == (2, 3), verdict.line


def test_a_job_that_moves_during_the_probe_was_slow_not_hung(store, monkeypatch):
    monkeypatch.setattr(watchdog, "PUBLISH_INTERVAL_S", 0.01)
    client = CountingStore(store.clone())
    ranks = [_watchdog(r, client) for r in range(3)]
    clock = [time.time()]

    def probe_wait(_s):  # rank 1 catches up while rank 0 waits for answers
        ranks[1].enter("all_reduce", 8)
        ranks[1]._publish()

    reader = HangReader(ranks[0], 3, clock=lambda: clock[0], sleep=probe_wait)
    for wd in ranks:
        wd.done(wd.enter("all_reduce", 8))
        wd.step_started()
        if wd.record.rank != 1:
            wd.enter("all_reduce", 8)
        wd._publish()
    assert reader.tick() is None
    clock[0] += 60.0
    assert reader.tick() is None and reader.verdict is None


def _standby_job(store, monkeypatch, world: int = 4):
    monkeypatch.setattr(watchdog, "PUBLISH_INTERVAL_S", 0.01)
    clients = [CountingStore(store.clone()) for _ in range(world)]
    ranks = [_watchdog(r, clients[r]) for r in range(world)]
    clock = [time.time()]
    stopped: set[int] = set()

    def answer(_s):  # the probe's wait: every live rank polls once
        for wd in ranks:
            if wd.record.rank not in stopped:
                wd._poll()

    def processes(places):  # the ranks share the reader's process table, which sees them stopped
        return {r: "stopped" for r in stopped}

    reader = HangReader(ranks[0], world, clock=lambda: clock[0], sleep=answer, processes=processes)
    standby = HangReader(ranks[1], world, clock=lambda: clock[0], sleep=answer, standby=True, processes=processes)
    for _ in range(3):  # a few steps, one second apart: rank 0's reader beats and learns the bound
        for wd in ranks:
            wd.done(wd.enter("all_reduce", 64))
            wd.step_started()
            wd._publish()
        clock[0] += 1.0
        assert reader.tick() is None and standby.tick() is None
    return ranks, clients, clock, stopped, reader, standby


def test_a_progressing_job_costs_the_standby_nothing_and_a_live_reader_keeps_the_verdict(store, monkeypatch):
    ranks, clients, clock, stopped, reader, standby = _standby_job(store, monkeypatch)
    # Its own record once a step, once where it runs (host, pid) and once its timeouts (a set and the arrival
    # count's add, comm/hang/agree.py): no standby traffic.
    assert clients[1].calls == {"set": 3 + 1 + 1, "add": 1}
    stopped.add(3)
    for wd in ranks[:3]:
        wd.enter("all_reduce", 64)
        wd._publish()
    clients[1].calls.clear()
    verdict = None
    for _ in range(30):  # rank 3 is stopped; rank 0's reader is alive, so the verdict is rank 0's
        clock[0] += 1.0
        verdict = verdict or reader.tick()
        assert standby.tick() is None
    assert verdict is not None and verdict.culprits == (3,)
    assert standby.verdict is None and clients[1].calls["multi_get"] == 0


def test_rank_0_stopped_is_named_by_the_standby_once_its_heartbeat_is_stale(store, monkeypatch):
    from npudist.comm.hang import reader as hang_reader

    ranks, clients, clock, stopped, _reader, standby = _standby_job(store, monkeypatch)
    stopped.add(0)  # rank 0 stops computing: its record and its reader's heartbeat stand still
    start = clock[0]
    for wd in ranks[1:]:
        wd.enter("all_reduce", 64)
        wd._publish()
    clients[1].calls.clear()
    verdict = None
    while verdict is None and clock[0] - start < 40:
        clock[0] += 1.0
        quiet = clock[0] - ranks[1].record.wall_time < hang.FLOOR_S
        before = clients[1].total()
        verdict = standby.tick()
        if quiet:  # waiting less than the floor: not even the heartbeat is read
            assert clients[1].total() == before
    took = clock[0] - json.loads(store.get(hang_reader.heartbeat_key()))["time"]  # from rank 0's last beat
    assert verdict is not None and verdict.culprits == (0,) and verdict.not_reached == (0,)
    assert verdict.culprit_ranks[0].alive is False
    assert hang_reader.HEARTBEAT_STALE_S <= took <= hang_reader.HEARTBEAT_STALE_S + 2, took
    assert json.loads(store.get(progress_store.verdict_key()))["culprits"] == [0]  # for the other ranks


def test_a_live_rank_left_inside_a_passed_call_looks_at_a_bounded_number_of_ranks_ahead(store, monkeypatch):
    """128 ranks moved on (alive) while rank 0 waits inside call 1: the probe of the ranks ahead lists at
    most AHEAD_LOOKED_AT of them, since every rank reads that list."""
    from npudist.comm.hang import reader as hang_reader

    monkeypatch.setattr(watchdog, "PUBLISH_INTERVAL_S", 0.01)
    asleep = Look(stack='  File "train.py", line 3, in step\n', cpu_s=0.0, span_s=0.5)
    monkeypatch.setattr(main_thread, "look_at_main", lambda busy, wait: asleep)
    client = CountingStore(store.clone())
    ranks = [_watchdog(r, client) for r in range(129)]
    probed: list[list[int]] = []
    reader = HangReader(ranks[0], 129, sleep=lambda s: [wd._poll() for wd in ranks[1:]])
    real_probe = reader._probe
    reader._probe = lambda rs: probed.append(list(rs)) or real_probe(rs)
    _one_behind(ranks, 0, "broadcast")
    reader._judge(reader.read(), 12.0, "")
    assert reader.verdict.culprits == (0,) and reader.verdict.states == {0: "out_of_order"}
    assert max(len(p) for p in probed) == hang_reader.AHEAD_LOOKED_AT


class SlowStore(CountingStore):
    """The job's store behind a link: each ``add`` waits the next of ``delays`` seconds first."""

    def __init__(self, inner: dist.Store, delays: list[float]) -> None:
        super().__init__(inner)
        self.delays = delays

    def add(self, *args):
        time.sleep(self.delays.pop(0))
        return self.inner.add(*args)


def test_a_rank_behind_a_slow_link_reports_its_store_round_trip_and_one_slow_poll_moves_nothing(store):
    from npudist.telemetry.exposition.collector_health import CollectorHealth
    from npudist.telemetry.job.comm_metrics import CommCollector

    behind = _watchdog(3, SlowStore(store.clone(), [0.12] * 5))
    quiet = _watchdog(1, SlowStore(store.clone(), [0.0, 0.0, 0.0, 0.0, 0.3]))
    assert behind.store_rtt_s is None  # before its first poll: no figure, no series
    for _ in range(5):
        behind._poll()
        quiet._poll()
    assert behind.store_rtt_s >= 0.12
    assert quiet.store_rtt_s < 0.1  # the median of 5: one 0.3 s poll (a pause) is not a slow link
    labels = ["3", "0", "node3", "cpu", "0", "r1"]
    fams = {f.name: f for f in CommCollector(CollectorHealth(), labels, stats=lambda: type("S", (), {"ops": ()})(),
                                             stall=lambda: None, store_rtt=lambda: behind.store_rtt_s).collect()}
    assert [s.value for s in fams["npudist_rank_store_rtt_seconds"].samples] == [behind.store_rtt_s]
    health = CollectorHealth()
    fams = {f.name for f in CommCollector(health, labels, stats=lambda: type("S", (), {"ops": ()})(),
                                          stall=lambda: None, store_rtt=lambda: 1 / 0).collect()}
    assert "npudist_rank_store_rtt_seconds" not in fams and health.errors("comm") == {"error": 1}
