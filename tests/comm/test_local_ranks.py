"""The launcher's look at its node's ranks (comm/hang/local_ranks.py): the pure rule on recorded looks, and
the process table read on a real stopped child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from npudist.comm.hang.local_ranks import STOPPED_NAMED_S, Seen, StoppedRanks, children


def _look(said: StoppedRanks, status: str, now: float, pid: int = 41, rank: str = "1") -> list[str]:
    return said.observe([Seen(pid=pid, rank=rank, status=status), Seen(pid=40, rank="0", status="sleeping")], now)


def test_a_stopped_rank_is_named_once_after_the_grace_and_again_when_it_runs():
    said = StoppedRanks(host="node7")
    assert _look(said, "running", 0.0) == []
    assert _look(said, "stopped", 2.0) == []
    assert _look(said, "stopped", 2.0 + STOPPED_NAMED_S - 0.5) == []  # a short pause says nothing
    (line,) = _look(said, "stopped", 2.0 + STOPPED_NAMED_S)
    assert line.startswith("npudist launch: rank 1 (pid 41 on node7) has been stopped (state T")
    assert f"for {STOPPED_NAMED_S:.0f} s" in line and "kill -CONT 41" in line
    assert _look(said, "stopped", 40.0) == []  # said once per stop
    assert _look(said, "sleeping", 41.0) == ["npudist launch: rank 1 (pid 41 on node7) runs again"]
    assert _look(said, "stopped", 42.0) == []  # a new stop starts its own grace
    assert len(_look(said, "stopped", 42.0 + STOPPED_NAMED_S)) == 1


def test_a_debugger_stop_is_named_as_such_and_a_short_pause_that_ends_is_never_said():
    said = StoppedRanks(host="h")
    assert _look(said, "tracing-stop", 0.0) == []
    assert "held by a debugger (state t)" in _look(said, "tracing-stop", STOPPED_NAMED_S)[0]
    quiet = StoppedRanks(host="h")
    assert _look(quiet, "stopped", 0.0) == [] and _look(quiet, "running", 3.0) == []  # never named: no "runs again"


def test_a_process_that_is_gone_is_forgotten():
    said = StoppedRanks(host="h")
    _look(said, "stopped", 0.0)
    assert said.observe([], 1.0) == [] and said.since == {} and said.named == set()


@pytest.mark.subprocess
def test_the_process_table_shows_a_stopped_child_with_its_rank():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, "RANK": "3"})
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            seen = {s.pid: s for s in children(os.getpid())}
            if child.pid in seen and seen[child.pid].status == "stopped":
                break
            time.sleep(0.05)
        assert seen[child.pid] == Seen(pid=child.pid, rank="3", status="stopped")
        os.kill(child.pid, signal.SIGCONT)
    finally:
        child.kill()
        child.wait(timeout=10)
