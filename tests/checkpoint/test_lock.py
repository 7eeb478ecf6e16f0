"""One job per run directory: a live holder refuses the next one by name, a dead one's lock is taken over."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from npudist.checkpoint.lock import LOCK_FILE, Holder, RunDirBusy, RunDirLock, parse_holder
from tests.conftest import child_env


def test_a_live_holder_refuses_a_second_claim_naming_host_pid_and_start(tmp_path):
    first = RunDirLock(tmp_path)
    first.acquire()
    with pytest.raises(RunDirBusy) as caught:
        RunDirLock(tmp_path).acquire()
    text = str(caught.value)
    assert f"is in use by another job (host {socket.gethostname()}, pid {os.getpid()}, started " in text
    assert "give this one its own --run-dir" in text
    first.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # a clean end leaves no name behind
    second = RunDirLock(tmp_path)
    assert second.acquire() is None  # free, and nothing stale to take over
    second.release()


def test_the_lock_of_a_killed_process_is_taken_over_with_a_warning(tmp_path, caplog):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from npudist.checkpoint import RunDirLock; "
                               "RunDirLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(300)",
                               str(tmp_path)], env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunDirBusy, match=f"pid {holder.pid}"):
            RunDirLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    lock = RunDirLock(tmp_path)
    with caplog.at_level(logging.WARNING, logger="npudist.checkpoint"):
        previous = lock.acquire()
    assert previous is not None and previous.pid == holder.pid and previous.host == socket.gethostname()
    assert f"took over the lock of a job that is no longer running (host {socket.gethostname()}, pid " \
           f"{holder.pid}, started {previous.started})" in caplog.text
    assert parse_holder((tmp_path / LOCK_FILE).read_text()).pid == os.getpid()
    lock.release()


def test_a_restart_of_the_same_torchrun_job_waits_for_its_predecessors_lock(tmp_path):
    old = RunDirLock(tmp_path)
    old.acquire(Holder("node-a", 11, "2026-12-03T00:00:00+00:00", job="run-7", restart=0))
    me = Holder("node-b", 12, "2026-12-03T00:01:00+00:00", job="run-7", restart=1)
    with pytest.raises(RunDirBusy, match="torchrun job 'run-7' restart 0"):
        RunDirLock(tmp_path).acquire(me, same_job_wait_s=0.5)  # still held after the wait: refused
    threading.Timer(0.5, old.release).start()  # e.g. an NFS server freeing a crashed client's lock
    new = RunDirLock(tmp_path)
    assert new.acquire(me, same_job_wait_s=30) is None
    new.release()
    other_job = Holder("node-c", 13, "2026-12-03T00:02:00+00:00", job="run-8")
    new.acquire(me)
    with pytest.raises(RunDirBusy, match="host node-b, pid 12"):
        RunDirLock(tmp_path).acquire(other_job, same_job_wait_s=30)  # another job: at once, no wait
    new.release()


@pytest.mark.parametrize("text", ["", "{", "[]", '{"host": 1}', '{"host": "h", "pid": "x", "started": 1}',
                                  "[" * 100000, json.dumps({"host": "h", "pid": 3})])
def test_a_damaged_lock_file_names_nobody_and_never_raises(text):
    assert parse_holder(text) is None
