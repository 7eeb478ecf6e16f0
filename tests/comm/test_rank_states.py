"""Busy is not hung: the states of the ranks a job waits for, and what the reader does with each.

Pure classification first, then the reader on a real TCPStore where the probed ranks' answers (their two
looks at the main thread) are chosen by the test: running, asleep, declared busy, or silent.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from npudist.comm.hang import abort_note, failure, main_thread, watchdog
from npudist.comm.hang import reader as hang_reader
from npudist.comm.hang import store as progress_store
from npudist.comm.hang.reader import HangReader
from npudist.comm.hang.watchdog import Record, Watchdog
from npudist.diagnosis import hang, rank_states
from npudist.diagnosis.rank_states import Look, classify
from tests.comm.test_hang import CountingStore

RUNNING = Look(stack='  File "eval.py", line 9, in evaluate\n', cpu_s=0.45, span_s=0.5, moved=True)
ASLEEP = Look(stack='  File "train.py", line 3, in step\n    time.sleep(1000)\n', cpu_s=0.0, span_s=0.5)


@pytest.mark.parametrize(("kw", "state"), [
    ({"out_of_order": True, "look": RUNNING}, "out_of_order"),  # inside another call: never completes
    ({"closed": True, "look": None}, "gone"),
    ({"look": None, "process": "gone"}, "gone"),
    ({"look": None}, "silent"),  # no process table to look in (another host or container): not proof of death
    ({"look": None, "process": "stopped"}, "stopped"),
    ({"look": None, "process": "alive"}, "starved"),  # a call holding the GIL starves the watchdog thread
    ({"look": ASLEEP}, "stuck"),
    ({"look": RUNNING}, "busy"),
    ({"look": Look(stack="s", cpu_s=0.0, span_s=0.5, moved=True)}, "busy"),  # a stack that moves runs
    ({"look": Look(stack="s", cpu_s=0.2, span_s=0.5)}, "busy"),  # CPU time without a stack change
    ({"look": Look(stack="s", cpu_s=0.01, span_s=0.5)}, "stuck"),  # 2 % of a core: a wait, not work
    ({"look": Look(stack="s", busy="serving requests", busy_s=130.0)}, "declared"),
    ({"look": ASLEEP, "inside_passed": True}, "out_of_order"),  # waits in a call the others have left
    ({"look": RUNNING, "inside_passed": True}, "busy"),  # an async call in flight while it computes
])
def test_a_rank_is_put_in_the_state_its_answer_shows(kw, state):
    kw = {"out_of_order": False, "closed": False, "probed": True, **kw}
    assert classify(**kw) == state


def test_only_dead_or_stuck_ranks_are_ever_aborted_and_busy_ones_only_when_asked():
    after = rank_states.abort_after
    assert after(["stopped", "busy"], stuck_s=300, busy_s=None) == 0
    assert after(["stuck", "busy"], stuck_s=300, busy_s=None) == 300
    assert after(["busy", "declared"], stuck_s=300, busy_s=None) is None
    assert after(["busy"], stuck_s=300, busy_s=900) == 900
    assert after(["silent", "busy"], stuck_s=300, busy_s=None) == rank_states.SILENT_ABORT_S == 60
    assert after(["silent", "stuck"], stuck_s=30, busy_s=None) == 30
    assert after(["starved"], stuck_s=300, busy_s=None) == 60  # alive but silent: a minute, not at once
    assert set(rank_states.STATES) == {"gone", "stopped", "out_of_order", "stuck", "busy", "declared", "starved",
                                       "silent"}


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"stack": 3}', b'{"stack": "s", "cpu_s": "x"}',
                                 b'{"stack": "s", "cpu_s": NaN, "span_s": -1, "busy": 7}'])
def test_an_answer_that_is_not_ours_is_kept_as_a_bare_stack_and_never_counts_as_running(raw):
    look = rank_states.parse_look(raw)
    assert look.cpu_s == 0.0 and not look.moved and look.busy == ""
    assert classify(out_of_order=False, closed=False, probed=True, look=look) == "stuck"


def test_the_main_thread_is_looked_at_running_or_asleep():
    """Two looks at this process's real main thread while it spins, then while it sleeps."""
    box: dict[str, Look] = {}
    stop = threading.Event()

    def look_later(name: str) -> None:
        time.sleep(0.1)
        box[name] = main_thread.look_at_main(None, time.sleep)
        stop.set()

    t = threading.Thread(target=look_later, args=("spin",))
    t.start()
    x = 0
    while not stop.is_set():
        x += 1
    t.join()
    stop.clear()
    t = threading.Thread(target=look_later, args=("sleep",))
    t.start()
    stop.wait(10)
    t.join()
    # Spinning, it runs (on a loaded host it may get a fifth of a core; the rule needs a tenth).
    assert classify(out_of_order=False, closed=False, probed=True, look=box["spin"]) == "busy", box["spin"]
    assert box["sleep"].cpu_ratio < 0.05 and not box["sleep"].moved
    assert "stop.wait(10)" in box["sleep"].stack


# --- the reader, on a real store -------------------------------------------------------------------------

@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))


def _job(store, monkeypatch, looks: dict[int, Look | None], world: int = 3,
         processes: dict[int, str] | None = None, **kw):
    """Rank 1 stays behind in collective 1 while the others wait in collective 2; its answer is looks[1]
    (None: it does not answer). ``processes``: what the reader's process table says of the ranks (the
    simulated ranks all live in this test process; {} models ranks on other hosts)."""
    monkeypatch.setattr(watchdog, "PUBLISH_INTERVAL_S", 0.01)
    monkeypatch.setattr(hang_reader, "REPROBE_S", 10.0)
    client = CountingStore(store.clone())
    ranks = []
    for r in range(world):
        wd = Watchdog(hang_action="abort", **kw)
        wd.record = Record(rank=r)
        wd._store = client
        ranks.append(wd)
    aborted: list[str] = []
    for wd in ranks:
        wd._abort = lambda message, box=aborted, **said: box.append(message)

    def answer(_s):
        for wd in ranks[1:]:
            if looks.get(wd.record.rank, "x") is not None:
                monkeypatch.setattr(watchdog, "look_at_main",
                                    lambda busy, wait, r=wd.record.rank: looks.get(r) or ASLEEP)
                wd._poll()

    clock = [time.time()]
    evidence = {} if processes is None else processes
    reader = HangReader(ranks[0], world, clock=lambda: clock[0], sleep=answer,
                        processes=lambda places: dict(evidence))
    for _ in range(3):
        for wd in ranks:
            wd.done(wd.enter("all_reduce", 8))
            wd.step_started()
            wd._publish()
        clock[0] += 1.0
        assert reader.tick() is None
    for wd in ranks:
        if wd.record.rank != 1:
            wd.enter("all_reduce", 8)
            wd._publish()
    return ranks, reader, clock, aborted


def _run(reader, clock, seconds: int) -> list:
    """The verdicts the reader said (printed) in ``seconds`` one-second periods: a period that only updates
    the stall of the verdict it holds says nothing new."""
    seen = []
    for _ in range(seconds):
        clock[0] += 1.0
        v = reader.tick()
        if v is not None and (not seen or seen[-1].line != v.line):
            seen.append(v)
    return seen


def test_a_busy_rank_is_reported_once_and_never_aborted(store, monkeypatch, tmp_path, capfd):
    _, reader, clock, aborted = _job(store, monkeypatch, {1: RUNNING}, run_dir=str(tmp_path))
    verdicts = _run(reader, clock, 120)
    assert len(verdicts) == 1 and aborted == []
    v = verdicts[0]
    assert v.states == {1: "busy"} and v.abort_after_seconds is None
    assert v.line.startswith("npudist busy:") and "live and busy (main thread at 90 % CPU, stack moving)" in \
        v.line and 'File "eval.py", line 9' in v.line and "npudist.busy(" in v.line
    assert not list(tmp_path.glob("hang-*.json"))  # a busy rank is not a hang
    assert capfd.readouterr().err.count("npudist busy:") == 1
    assert not store.check([progress_store.verdict_key()])  # the standby may still stand in if rank 0 stops later


def test_a_busy_rank_that_then_stops_answering_is_aborted_at_the_next_look(store, monkeypatch, tmp_path):
    looks: dict[int, Look | None] = {1: RUNNING}
    processes: dict[int, str] = {1: "alive"}
    _, reader, clock, aborted = _job(store, monkeypatch, looks, processes=processes, run_dir=str(tmp_path))
    assert len(_run(reader, clock, 30)) == 1 and aborted == []
    looks[1], processes[1] = None, "stopped"  # SIGSTOP: its process table says T
    seen = _run(reader, clock, int(hang_reader.REPROBE_S) + 2)
    assert seen and seen[-1].states == {1: "stopped"} and aborted  # (the fake abort does not exit)
    assert "did not answer: stopped (process state: stopped)" in seen[-1].line
    assert json.loads(store.get(progress_store.verdict_key()))["states"] == {"1": "stopped"}


def test_a_rank_whose_gil_is_held_is_starved_not_stopped_and_survives_a_40_s_call(store, monkeypatch, tmp_path):
    """A 40 s pickle.load holds the GIL: the watchdog thread cannot answer, but the process table says the
    process runs. Named as starved and reported as busy (kept on file), aborted only after 60 s of stall (a
    node cut off from the store in the same process table looks the same, and must not hang the job)."""
    _, reader, clock, aborted = _job(store, monkeypatch, {1: None}, processes={1: "alive"}, run_dir=str(tmp_path))
    seen = _run(reader, clock, 45)
    assert seen and all(v.states == {1: "starved"} for v in seen) and aborted == []
    assert seen[0].line.startswith("npudist busy:") and "its watchdog thread is starved" in seen[0].line
    assert seen[0].abort_after_seconds == 60 and (tmp_path / "hang-attempt0.json").exists()
    _run(reader, clock, 25)
    assert aborted  # ~67 s of stall


def test_a_silent_rank_on_another_host_is_named_at_once_and_aborted_after_a_minute(store, monkeypatch, tmp_path):
    """No process table to look in: silence is not proof of death, so the abort waits SILENT_ABORT_S."""
    _, reader, clock, aborted = _job(store, monkeypatch, {1: None}, processes={}, run_dir=str(tmp_path))
    first = _run(reader, clock, 20)
    assert first and first[0].states == {1: "silent"} and first[0].abort_after_seconds == 60
    assert "not in this host's process table" in first[0].line and aborted == []
    _run(reader, clock, 30)
    assert aborted == []  # ~50 s of stall
    _run(reader, clock, 15)
    assert aborted


def test_a_stuck_rank_is_named_at_once_and_aborted_only_at_the_stuck_bound(store, monkeypatch, tmp_path):
    _, reader, clock, aborted = _job(store, monkeypatch, {1: ASLEEP}, run_dir=str(tmp_path), stuck_timeout_s=60)
    first = _run(reader, clock, 20)
    assert len(first) == 1 and first[0].states == {1: "stuck"} and aborted == []
    assert first[0].stalled_seconds <= 15 and "answered: live but stuck" in first[0].line
    assert 'File "train.py", line 3, in step' in first[0].line and "time.sleep(1000)" in \
        first[0].culprit_ranks[1].stack
    assert "no progress for 60 s in all (NPUDIST_STUCK_TIMEOUT)" in first[0].line
    assert json.loads((tmp_path / "hang-attempt0.json").read_text())["states"] == {"1": "stuck"}
    _run(reader, clock, 30)
    assert aborted == []  # stalled ~50 s < 60 s
    _run(reader, clock, 15)
    assert aborted


def test_a_declared_phase_is_expected_and_progress_ends_the_episode(store, monkeypatch, tmp_path):
    front = Look(stack="  File \"front.py\", line 5, in serve\n", busy="waiting for requests", busy_s=40.0)
    ranks, reader, clock, aborted = _job(store, monkeypatch, {1: front}, run_dir=str(tmp_path))
    v = _run(reader, clock, 40)
    assert len(v) == 1 and v[0].states == {1: "declared"} and aborted == []
    assert "declared busy in 'waiting for requests' for 40 s" in v[0].line and "npudist.busy(" not in v[0].line
    for wd in ranks:  # rank 1 catches up: the job moves on and the episode is over
        if wd.record.rank == 1:
            wd.done(wd.enter("all_reduce", 8))
            wd.enter("all_reduce", 8)
        else:
            wd.done(wd.record.seq)
        wd._publish()
    clock[0] += 1.0
    assert reader.tick() is None and reader.verdict is None


def test_the_abort_names_the_culprit_for_torchrun_and_says_what_happens_next(tmp_path, monkeypatch):
    """The error file is read back by torch's own ProcessFailure, as torchrun's Root Cause block reads it."""
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    note = abort_note.restart_note()
    assert "nothing restarts it (--max-restarts 0)" in note and "resumes from the last checkpoint" in note
    line = "npudist hang: ... rank(s) 1 never reached it: rank 1 (node7 pid 42) ..."
    abort_note.write_error_file("rank 0: aborting; " + line, 1000.0)
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=124, error_file=str(path))
    assert failure.timestamp == 1000  # before the culprit's own exit is seen: torchrun picks it first
    assert "rank 1 (node7 pid 42)" in failure.message["extraInfo"]["py_callstack"]
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert abort_note.restart_note() == "the launcher restarts the job (restart 2 of --max-restarts 3)"


def test_the_error_file_is_not_written_through_a_planted_symlink(tmp_path, monkeypatch):
    target = tmp_path / "victim"
    target.write_text("keep")
    (tmp_path / "error.json").symlink_to(target)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    abort_note.write_error_file("x", None)
    assert target.read_text() == "keep"


def test_the_states_table_bounds_match_the_code():
    assert rank_states.STATES["stuck"].abort == "stuck" and "300 s" in rank_states.STATES["stuck"].bound
    from npudist.runtime.settings import DEFAULT_STUCK_TIMEOUT_S
    assert DEFAULT_STUCK_TIMEOUT_S == 300.0 and hang.FLOOR_S == 10.0


def test_the_manual_has_the_table_of_rank_states_as_the_code_applies_it():
    """Every state's row, word for word, in the README or a docs/ page: the table cannot drift from STATES."""
    from tests.conftest import REPO

    text = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])
    for s in rank_states.STATES.values():
        row = next((ln for ln in text.splitlines() if ln.startswith("|") and f"(`{s.name}`)" in ln), None)
        assert row is not None, s.name
        assert s.seen in row and s.action in row and s.bound in row, (s.name, row)
    assert f"{hang_reader.REPROBE_S:.0f} s" in rank_states.STATES["busy"].action


def test_hang_reports_are_not_written_through_symlinks_planted_in_the_run_dir(store, monkeypatch, tmp_path):
    """hang-attempt*.json (the reader's verdict) and hang-rank*.json (a failed collective's report)."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("hang-attempt0.json", "hang-rank0.json"):
        (run_dir / name).symlink_to(victim)
    ranks, reader, clock, _aborted = _job(store, monkeypatch, {1: None}, processes={1: "stopped"},
                                          run_dir=str(run_dir))
    assert _run(reader, clock, 20)[0].states == {1: "stopped"}
    err = failure.report(ranks[0], op="all_reduce", seq=4, nbytes=8, records=reader.read(), cause="timeout",
                         verdict=None)
    assert "rank 1 on " in str(err) and err.report["where"]["1"]["pid"] > 0
    assert victim.read_text() == "keep"
    for name in ("hang-attempt0.json", "hang-rank0.json"):
        path = run_dir / name
        assert not path.is_symlink() and json.loads(path.read_text())
    assert sorted(p.name for p in run_dir.iterdir()) == ["hang-attempt0.json", "hang-rank0.json"]  # no leftovers


def test_the_dead_are_named_and_the_live_ranks_behind_with_them_are_held_back():
    """A node lost with a collective in flight: ranks 2-3 do not answer, rank 1 (alive) is behind with them."""
    records = {r: Record(r, seq=9, state="entered") for r in (0, 4, 5, 6)}
    records.update({r: Record(r, seq=8, state="entered") for r in (1, 2, 3)})
    v = hang.judge(records, hang.suspects(records), {1}, {1: ASLEEP}, now=1.0, stalled_s=12.0, bound_s=10.0,
                   processes={2: "gone", 3: "gone"})
    assert v.culprits == (2, 3) and v.held_back == (1,) and v.states == {2: "gone", 3: "gone"}
    assert v.abort_after_seconds == 0 and "rank(s) 1 answered but wait on them" in v.line
    # The same node on another host: silent, still named and the live rank held back, aborted after a minute.
    v = hang.judge(records, hang.suspects(records), {1}, {1: ASLEEP}, now=1.0, stalled_s=12.0, bound_s=10.0)
    assert v.culprits == (2, 3) and v.held_back == (1,) and v.states == {2: "silent", 3: "silent"}
    assert v.abort_after_seconds == 60


def test_live_ranks_left_inside_a_call_by_ranks_that_then_died_blame_the_dead(store, monkeypatch, tmp_path):
    """A node lost just after its ranks' records moved past the call the live node still waits in (a 2 + 2
    split, so the live ranks look like the odd ones below): the silent ranks ahead are named, not the live."""
    ranks, reader, clock = _two_nodes_then_node1_dies(store, monkeypatch, tmp_path)
    for wd in ranks:
        seq = wd.enter("all_reduce", 8)
        if wd.record.rank >= 2:  # finished it and entered the next one, then the node died
            wd.done(seq)
            wd.enter("all_reduce", 8)
        wd._publish()
    v = next(v for v in _run(reader, clock, 30) if v is not None)
    assert v.culprits == (2, 3) and set(v.states.values()) == {"gone"}, v.line
    assert v.abort_after_seconds == 0 and "rank(s) 2, 3 " in v.line


def test_a_loop_starved_of_cpu_on_a_loaded_host_is_busy_not_stuck():
    """Load 10 on 2 cores: the evaluating rank gets ~5 % of a core but waits for one the rest of the time."""
    starved = Look(stack="s", cpu_s=0.02, ready_s=0.45, span_s=0.5)
    assert classify(out_of_order=False, closed=False, probed=True, look=starved) == "busy"
    assert "waiting for one (a loaded host)" in rank_states.describe("busy", starved)
    assert rank_states.parse_look(starved.to_json()) == starved


def test_the_main_threads_run_delay_is_read_from_schedstat(tmp_path):
    (tmp_path / "schedstat").write_text("328516 2455716000 2\n")
    assert main_thread.main_ready_s(str(tmp_path / "schedstat")) == pytest.approx(2.455716)
    for bad in ("", "x y z", "1\n"):
        (tmp_path / "schedstat").write_text(bad)
        assert main_thread.main_ready_s(str(tmp_path / "schedstat")) == 0.0
    assert main_thread.main_ready_s(str(tmp_path / "missing")) == 0.0
    if os.path.exists("/proc/thread-self/schedstat"):  # this host's kernel keeps it: the real file parses
        assert main_thread.main_ready_s() >= 0.0


@pytest.mark.subprocess
def test_a_cpu_bound_main_thread_starved_by_other_processes_is_seen_running():
    """Real processes: the main thread spins while 4 spinners per CPU share the cores; its look says busy."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")  # a bare loop: nothing to re-import, spinning at once
    spinners = [ctx.Process(target=_spin, daemon=True) for _ in range(4 * (os.cpu_count() or 1))]
    for p in spinners:
        p.start()
    look: list[Look] = []
    t = threading.Thread(target=lambda: look.append(main_thread.look_at_main(None, time.sleep)))
    try:
        t.start()
        deadline = time.monotonic() + 5
        while t.is_alive() and time.monotonic() < deadline:
            sum(i * i for i in range(2000))  # the main thread's "evaluation"
        t.join()
    finally:
        for p in spinners:
            p.kill()
    assert classify(out_of_order=False, closed=False, probed=True, look=look[0]) == "busy", look[0]
    assert look[0].run_ratio >= 0.5 and look[0].ready_s > 0.1, look[0]  # here: ~20 % on a CPU, ~80 % waiting


def _spin() -> None:
    while True:
        pass


def test_a_node_lost_with_one_rank_inside_the_call_and_one_behind_it_is_blamed_whole(store, monkeypatch, tmp_path):
    """2 nodes x 2 ranks (LOCAL_WORLD_SIZE 2): node1's rank 2 had entered the call the others wait in, rank 3
    not yet, when the node died. Rank 3 alone is behind; rank 2, on its host and silent too, is named with it."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    ranks, reader, clock = _two_nodes_then_node1_dies(store, monkeypatch, tmp_path)
    for wd in ranks[:3]:  # rank 3 died before it entered the control call
        wd.enter("control all_reduce", 0)
        wd._publish()
    v = next(v for v in _run(reader, clock, 30) if v is not None)
    assert v.culprits == (2, 3) and set(v.states.values()) == {"gone"}, v.line
    assert v.waiting == (0, 1) and "rank(s) 2, 3 never reached it" in v.line


def _two_nodes_then_node1_dies(store, monkeypatch, tmp_path):
    """4 ranks (2 nodes x 2) step together 3 times; from then on only ranks 0 and 1 answer a probe, and the
    reader's process table (namespace nodes share one) no longer holds ranks 2 and 3."""
    monkeypatch.setattr(watchdog, "PUBLISH_INTERVAL_S", 0.01)
    client = CountingStore(store.clone())
    ranks = []
    for r in range(4):
        wd = Watchdog(hang_action="abort", run_dir=str(tmp_path))
        wd.record = Record(rank=r)
        wd._store = client
        wd._abort = lambda message, **said: None
        ranks.append(wd)
    monkeypatch.setattr(watchdog, "look_at_main", lambda busy, wait: ASLEEP)
    monkeypatch.setattr(main_thread, "look_at_main", lambda busy, wait: ASLEEP)
    clock = [time.time()]
    reader = HangReader(ranks[0], 4, clock=lambda: clock[0], sleep=lambda s: ranks[1]._poll(),
                        processes=lambda places: {2: "gone", 3: "gone"})
    for _ in range(3):
        for wd in ranks:
            wd.done(wd.enter("all_reduce", 8))
            wd.step_started()
            wd._publish()
        clock[0] += 1.0
        assert reader.tick() is None
    return ranks, reader, clock


def test_a_rank_cut_off_from_the_store_exits_only_when_its_collectives_stopped_too():
    wd = Watchdog(hang_action="abort")
    wd.record = Record(rank=2)
    aborted: list[str] = []
    wd._abort = lambda message, **said: aborted.append(message)
    err = ConnectionError("store unreachable")
    wd.enter("all_reduce", 8)
    for t in (0.0, 5.0):
        wd._cut_off(t, err)
    wd.done(wd.record.seq)
    wd.enter("all_reduce", 8)  # a collective completed while the store was out of reach: not cut off
    for t in (6.0, 11.0, 15.0):
        wd._cut_off(t, err)
    assert aborted == []
    wd._cut_off(16.5, err)  # 10.5 s without the store and without a collective completing
    assert len(aborted) == 1 and "cut off from the job for 10 s inside all_reduce #2" in aborted[0]
