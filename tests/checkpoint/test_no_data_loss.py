"""Saves never lose a checkpoint: pruning counts only whole ones, a lower step is another run's directory,
a step saved again always has one complete copy, and a write killed midway leaves nothing behind."""

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from npudist import checkpoint
from npudist.checkpoint import atomic, store
from npudist.checkpoint.layout import verify
from npudist.checkpoint.writer import writer
from tests.conftest import REPO, child_env


@pytest.fixture(autouse=True)
def settled():
    writer().close()
    yield
    writer().close()


class Crash(BaseException):
    """A kill at this point: nothing after it runs, no `except Exception` cleans up."""


def _w(tmp_path, step=None):
    got = checkpoint.load_latest(tmp_path)
    return None if got is None else (got[1], got[0]["w"].tolist())


@pytest.mark.parametrize("async_save", [False, True])
def test_a_stray_newer_step_directory_neither_counts_nor_deletes_the_new_checkpoint(tmp_path, caplog, async_save):
    (tmp_path / "step-99999999").mkdir()  # no manifest: not a checkpoint
    for step in (1, 2):
        got = checkpoint.save({"w": torch.full((2,), float(step))}, tmp_path, step, keep=1, async_save=async_save)
        path = got.wait() if async_save else got
        assert path == tmp_path / f"step-{step:08d}" and verify(path)[1] is None
    assert checkpoint.list_checkpoints(tmp_path) == [99999999, 2]  # the stray one is left as it was
    with caplog.at_level(logging.WARNING, logger="npudist.checkpoint"):
        assert _w(tmp_path) == (2, [2.0, 2.0])


@pytest.mark.parametrize("async_save", [False, True])
def test_saving_below_the_newest_checkpoint_is_refused_unless_overwrite(tmp_path, async_save):
    checkpoint.save({"w": torch.ones(2)}, tmp_path, 100, keep=1)
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.save({"w": torch.zeros(2)}, tmp_path, 10, keep=1, async_save=async_save)
    text = str(caught.value)
    assert "refusing to save checkpoint step 10" in text and "already holds step 100" in text
    assert "another run's directory" in text and "overwrite=True" in text
    assert checkpoint.list_checkpoints(tmp_path) == [100] and not list(tmp_path.glob(".tmp-*"))
    got = checkpoint.save({"w": torch.zeros(2)}, tmp_path, 10, keep=1, async_save=async_save, overwrite=True)
    if async_save:
        got.wait()
    assert checkpoint.list_checkpoints(tmp_path) == [10] and _w(tmp_path) == (10, [0.0, 0.0])
    checkpoint.save({"w": torch.ones(2) * 3}, tmp_path, 10, keep=1)  # the same step again is a resume: allowed
    assert _w(tmp_path) == (10, [3.0, 3.0])


def test_pruning_keeps_the_newest_k_whole_checkpoints_and_skips_broken_ones(tmp_path):
    for step in (1, 2, 3):
        checkpoint.save({"w": torch.full((2,), float(step))}, tmp_path, step, keep=5)
    (tmp_path / "step-00000003" / "manifest.json").unlink()  # step 3 is broken: it must not count
    checkpoint.save({"w": torch.full((2,), 4.0)}, tmp_path, 4, keep=2)
    assert checkpoint.list_checkpoints(tmp_path) == [4, 3, 2]


def _crash_after(real, when):
    def patched(*args, **kw):
        result = real(*args, **kw)
        if when(*args):
            raise Crash(args)
        return result

    return patched


def test_resaving_a_step_never_leaves_it_without_a_complete_copy(tmp_path, monkeypatch):
    checkpoint.save({"w": torch.ones(2)}, tmp_path, 5, keep=1)
    # Crash right after any tree removal during the re-save: the step must still be whole.
    monkeypatch.setattr(store.shutil, "rmtree", _crash_after(store.shutil.rmtree, lambda path, *a: True))
    with pytest.raises(Crash):
        checkpoint.save({"w": torch.full((2,), 2.0)}, tmp_path, 5, keep=1)
    monkeypatch.undo()
    assert verify(tmp_path / "step-00000005")[1] is None and _w(tmp_path) == (5, [2.0, 2.0])


def test_without_rename_exchange_a_replace_that_dies_midway_is_put_back(tmp_path, monkeypatch):
    """Filesystems without RENAME_EXCHANGE (NFS): the old copy is moved aside, and restored if the new one
    never took its place."""
    checkpoint.save({"w": torch.ones(2)}, tmp_path, 5, keep=2)

    def no_exchange(a, b):
        raise OSError(errno.EINVAL, "not supported here")

    monkeypatch.setattr(atomic, "exchange", no_exchange)
    monkeypatch.setattr(store.os, "rename", _crash_after(os.rename, lambda src, dst: os.path.basename(src)
                                                         .startswith(".old-")
                                                         or os.path.basename(dst).startswith(".old-")))
    with pytest.raises(Crash):
        checkpoint.save({"w": torch.full((2,), 2.0)}, tmp_path, 5, keep=2)
    monkeypatch.undo()
    assert (tmp_path / ".old-step-00000005").is_dir()  # the only copy of step 5, for now
    checkpoint.save({"w": torch.full((2,), 6.0)}, tmp_path, 6, keep=2)
    assert checkpoint.list_checkpoints(tmp_path) == [6, 5] and not list(tmp_path.glob(".*"))
    assert verify(tmp_path / "step-00000005")[1] is None
    # ...and without a crash, the fallback replaces the step whole.
    monkeypatch.setattr(atomic, "exchange", no_exchange)
    checkpoint.save({"w": torch.full((2,), 7.0)}, tmp_path, 6, keep=2)
    assert _w(tmp_path) == (6, [7.0, 7.0]) and not list(tmp_path.glob(".*"))


@pytest.mark.subprocess
def test_a_write_killed_in_the_background_leaves_no_debris_after_the_next_save(tmp_path):
    script = ("import sys, torch; from npudist import checkpoint; "
              "checkpoint.save({'w': torch.ones(1 << 16)}, sys.argv[1], 1, async_save=True); "
              "print('started', flush=True); import time; time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True, env=child_env({store.TEST_DELAY_VAR: "300"}))
    try:
        assert proc.stdout.readline() == "started\n"
        partial = tmp_path / ".tmp-step-00000001" / "state.pt"
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.stat().st_size > 1 << 18) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert partial.exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert checkpoint.list_checkpoints(tmp_path) == []
    checkpoint.save({"w": torch.ones(2)}, tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002"]


def _two_ranks_meet_failures(tmp_path, run_dir, mode):
    proc = subprocess.Popen([sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2",
                             str(REPO / "tests/checkpoint/failure_probe.py"), str(tmp_path), str(run_dir), mode],
                            cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)  # a rank left waiting in a collective would hang here
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the ranks it started, nothing else
            proc.communicate(timeout=30)
    assert proc.returncode == 0, out[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def _assert_failed_cleanly(ranks, run_dir, errno_name, what):
    zero, one = ranks
    # Every rank raises the same CheckpointError, naming the errno and the file, and what is intact.
    assert zero["sync"] == one["sync"]
    assert zero["sync"].startswith("CheckpointError: could not save checkpoint step 2: ")
    assert what in zero["sync"] and f"({errno_name} writing {run_dir}/.tmp-step-00000002/state.pt)" in zero["sync"]
    assert "the previous checkpoint (step 1) is untouched" in zero["sync"]
    assert zero["async"].startswith("CheckpointError: could not save checkpoint step 3: ") and \
        errno_name in zero["async"]
    assert zero["tmp_after_sync"] == one["tmp_after_sync"] == [] and zero["tmp_after_async"] == []
    assert [r["all_reduce"] for r in ranks] == [2.0, 2.0]  # the job went on, its collectives in step
    assert [r["after"] for r in ranks] == ["no error"] * 2 and [r["checkpoints"] for r in ranks] == [[4]] * 2


@pytest.mark.ranks
@pytest.mark.slow
def test_a_real_file_size_limit_is_one_checkpoint_error_on_every_rank_and_the_job_goes_on(tmp_path):
    """torch.save meets a real EFBIG (RLIMIT_FSIZE) and reports it as RuntimeError('unexpected pos')."""
    run_dir = tmp_path / "run"
    ranks = _two_ranks_meet_failures(tmp_path, run_dir, "rlimit")
    _assert_failed_cleanly(ranks, run_dir, "EFBIG", "file size limit")
    for r in ranks:  # the lock cases of the same job
        assert r["symlinked_lock"].startswith("RunDirLockError: ") and "is a symlink" in r["symlinked_lock"]
        assert r["hostile_lock"] == "no error"  # an implausible record names nobody: taken over
        assert not r["victim_exists"]


def _mount_small_tmpfs(where) -> bool:
    where.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)], capture_output=True,
                              text=True, timeout=30, check=False)
    except OSError:
        return False
    return done.returncode == 0


@pytest.mark.ranks
@pytest.mark.slow
def test_a_really_full_filesystem_is_one_checkpoint_error_on_every_rank_and_the_job_goes_on(tmp_path):
    mnt = tmp_path / "small"
    if not _mount_small_tmpfs(mnt):
        pytest.skip("cannot mount a tmpfs here (needs root and mount rights); the RLIMIT_FSIZE test covers "
                    "the same path")
    try:
        ranks = _two_ranks_meet_failures(tmp_path, mnt / "run", "full")
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30, check=False)
    _assert_failed_cleanly(ranks, mnt / "run", "ENOSPC", "no space left on the device")
