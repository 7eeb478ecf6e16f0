"""quiesce(): the rank's last teardown step waits for in-flight collectives and busy backend threads, bounded.

Thread states are recorded /proc/self/task/TID/stat lines (proc(5)); the clock and sleep are injected, so the
waits are counted, not timed.
"""

from __future__ import annotations

import threading

from npudist.comm.quiesce import (
    QUIESCE_S,
    SAMPLE_S,
    ThreadState,
    backend_busy,
    failed_by_collective,
    parse_stat,
    quiesce,
    read_threads,
)
from npudist.runtime.state import CLOSE_ORDER

# Recorded from a gloo rank on Linux 6.x: the worker's name, and a name holding ") " as a script may choose.
GLOO_WORKER = "4242 (pt_gloo_runloop) S 4100 4100 4100 0 -1 4194368 11 0 0 0 3 1 0 0 20 0 5 0 8871 0 0"
ODD_NAME = "4243 (a) R (b) R 4100 4100 4100 0 -1 4194368 11 0 0 0 3 1 0 0 20 0 5 0 8871 0 0"


def test_stat_line_gives_name_and_state_even_with_parentheses_in_the_name():
    assert parse_stat(4242, GLOO_WORKER) == ThreadState(tid=4242, name="pt_gloo_runloop", state="S")
    assert parse_stat(4243, ODD_NAME) == ThreadState(tid=4243, name="a) R (b", state="R")
    assert parse_stat(1, "") is None
    assert parse_stat(1, "garbage without parentheses") is None


def test_read_threads_sees_this_process_and_nothing_where_there_is_no_proc(tmp_path):
    me = threading.get_native_id()
    assert me in {t.tid for t in read_threads()}
    assert read_threads(str(tmp_path / "missing")) == []


def test_python_threads_and_sleeping_native_threads_are_not_busy():
    threads = [ThreadState(1, "python", "R"), ThreadState(2, "npudist-watchdog", "R"),
               ThreadState(3, "pt_gloo_runloop", "S"), ThreadState(4, "gloo_tcp_loop", "S")]
    assert backend_busy(threads, python_ids={1, 2}) == ()
    threads.append(ThreadState(5, "pt_gloo_runloop", "R"))
    assert backend_busy(threads, python_ids={1, 2}) == ("pt_gloo_runloop",)


class World:
    """Scripted samples: each call to threads()/flying() reads the next state; sleep advances the clock."""

    def __init__(self, busy: list[bool], flying: list[int]) -> None:
        self.busy, self.flying_n, self.now, self.sleeps = busy, flying, 0.0, 0

    def threads(self) -> list[ThreadState]:
        busy = self.busy.pop(0) if len(self.busy) > 1 else self.busy[0]
        return [ThreadState(7, "pt_gloo_runloop", "R" if busy else "S")]

    def flying(self) -> int:
        return self.flying_n.pop(0) if len(self.flying_n) > 1 else self.flying_n[0]

    def sleep(self, s: float) -> None:
        self.sleeps += 1
        self.now += s

    def run(self, timeout_s: float = QUIESCE_S, failed: bool = False):
        return quiesce(timeout_s, threads=self.threads, flying=self.flying, python_ids=lambda: set(),
                       sleep=self.sleep, clock=lambda: self.now, failed=lambda: failed)


def test_quiet_backend_needs_two_quiet_samples_in_a_row():
    w = World(busy=[False], flying=[0])
    got = w.run()
    assert got.quiet and w.sleeps == 1


def test_a_worker_caught_running_between_quiet_samples_restarts_the_count():
    w = World(busy=[False, True, False, False], flying=[0])
    got = w.run()
    assert got.quiet and w.sleeps == 3


def test_a_collective_in_flight_is_waited_for_until_it_completes():
    w = World(busy=[False], flying=[1, 1, 1, 0, 0])
    got = w.run()
    assert got.quiet and w.sleeps == 4


def test_the_wait_is_bounded_and_says_what_was_still_busy():
    w = World(busy=[True], flying=[2])
    got = w.run(timeout_s=0.5)
    assert not got.quiet
    assert (got.in_flight, got.busy) == (2, ("pt_gloo_runloop",))
    assert 0.5 <= got.waited_s < 0.5 + 2 * SAMPLE_S


def test_the_backend_step_comes_after_the_group_and_before_the_run_dir_lock():
    order = list(CLOSE_ORDER)
    assert order.index("comm") < order.index("group") < order.index("backend") < order.index("run_dir_locks")


def test_a_rank_leaving_on_a_failed_collective_waits_only_for_its_threads():
    # The failed call stays in flight for good (pg_watch.cpp counts completions only): waiting on it is the
    # whole bound for nothing. The threads' rest is still waited for.
    w = World(busy=[True, True, False], flying=[1])
    got = w.run(failed=True)
    assert got.quiet and w.sleeps == 3
    assert got.waited_s < 5 * SAMPLE_S
    stuck = World(busy=[False], flying=[1])
    assert not stuck.run(timeout_s=0.5).quiet  # the same counters without a failure: waited for, to the bound


def _raised_in(filename: str, exc: BaseException) -> BaseException:
    """``exc`` raised from code compiled as ``filename`` (a stand-in for a frame of that library)."""
    try:
        exec(compile("raise exc", filename, "exec"), {"exc": exc})
    except BaseException as got:
        return got
    raise AssertionError("not raised")


def test_a_collective_failure_is_told_by_where_it_was_raised_or_its_type():
    import torch.distributed as dist

    gloo = _raised_in("/venv/site-packages/torch/distributed/distributed_c10d.py",
                      RuntimeError("Connection closed by peer"))
    assert failed_by_collective(gloo)
    assert failed_by_collective(_raised_in("/src/npudist/comm/watched.py", RuntimeError("hang")))
    assert failed_by_collective(dist.DistBackendError("NCCL error"))
    try:  # the script's own exception raised while handling the collective's
        try:
            raise gloo
        except RuntimeError as inner:
            raise SystemExit(1) from inner
    except SystemExit as outer:
        assert failed_by_collective(outer)


def test_other_exceptions_keep_the_whole_wait():
    assert not failed_by_collective(None)
    assert not failed_by_collective(_raised_in("/work/train.py", ValueError("bad batch")))
    assert not failed_by_collective(_raised_in("/work/train.py", RuntimeError("CUDA out of memory")))

    # A wrapper further out in torch.distributed (torchrun's @record) does not make any exception a collective's.
    def script():
        raise ValueError("bad batch")

    wrapper = compile("def record(fn):\n    fn()\n", "/venv/torch/distributed/elastic/errors/__init__.py", "exec")
    scope: dict = {}
    exec(wrapper, scope)
    try:
        scope["record"](script)
    except ValueError as exc:
        assert not failed_by_collective(exc)


def test_the_watch_forgets_its_counts_only_after_the_exit_wait(monkeypatch):
    # The counters are how the wait sees a collective in flight, so they are still there when it runs; forgetting
    # them (for the next process group) comes after it.
    from npudist.comm import pg_watch
    from npudist.comm import state as comm_state
    from npudist.runtime.settings import Settings
    from npudist.runtime.state import Runtime

    seen: list[str] = []
    monkeypatch.setattr(comm_state, "quiesce", lambda: seen.append("wait"))
    monkeypatch.setattr(pg_watch, "loaded", lambda: True)
    monkeypatch.setattr(pg_watch, "reset", lambda: seen.append("reset"))
    rt = Runtime(Settings())
    comm_state._attach(rt)
    rt.close()
    assert seen == ["wait", "reset"]
