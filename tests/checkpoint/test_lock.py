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

from npudist.checkpoint.lock import LOCK_FILE, Holder, RunDirBusy, RunDirLock, RunDirLockError, parse_holder
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


@pytest.mark.subprocess
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


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path, dangling):
    target = tmp_path / "precious.txt"
    if not dangling:
        target.write_text("keep me")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).symlink_to(target)
    with pytest.raises(RunDirLockError, match=r"\.npudist\.lock is a symlink"):
        RunDirLock(run_dir).acquire()
    assert (target.read_text() == "keep me") if not dangling else not target.exists()


def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path):
    os.mkfifo(tmp_path / LOCK_FILE)
    with pytest.raises(RunDirLockError, match="not a regular file"):
        RunDirLock(tmp_path).acquire()


HOSTILE = ['{"host": "h", "pid": 1e999, "started": "x"}', '{"host": "h", "pid": true, "started": "x"}',
           '{"host": ["h"], "pid": 5, "started": "x"}', '{"host": "h", "pid": 5, "started": "x", "restart": 1e400}',
           '{"host": "h", "pid": -5, "started": "x"}', '{"host": "h", "pid": 100000000000000000000, "started": "x"}',
           '{"host": "h", "pid": 5, "started": "x", "job": {"a": 1}}', '{"host": "' + "h" * 5000 + '", "pid": 5, '
           '"started": "x"}']


@pytest.mark.parametrize("text", HOSTILE)
def test_an_absurd_holder_record_names_nobody_and_is_taken_over_or_refused_by_name(tmp_path, text):
    assert parse_holder(text) is None
    (tmp_path / LOCK_FILE).write_text(text)
    lock = RunDirLock(tmp_path)
    assert lock.acquire() is None  # free: taken over, the record replaced by this process's
    assert parse_holder((tmp_path / LOCK_FILE).read_text()).pid == os.getpid()
    os.pwrite(lock._fd, text.encode(), 0)  # held, with the absurd record: a named refusal
    with pytest.raises(RunDirBusy, match="a process that has not yet written its name"):
        RunDirLock(tmp_path).acquire()
    lock.release()
