"""Asynchronous saves: a consistent copy, one write in flight, background failures raised later, metrics."""

import errno
import logging

import pytest
import torch
import torch.distributed as dist

import npudist
from npudist import checkpoint
from npudist.checkpoint import store
from npudist.checkpoint.writer import SlowDisk, writer
from npudist.runtime import compat
from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.job.checkpoint_metrics import CheckpointCollector
from tests.checkpoint.test_store import _failing_save


@pytest.fixture(autouse=True)
def settled():
    writer().close()  # no earlier test's write (or error) leaks into this one
    yield
    writer().close()


def _slow(monkeypatch, seconds: float) -> None:
    monkeypatch.setattr(writer(), "slow_disk", SlowDisk(background_s=seconds))


def test_the_copy_is_taken_before_save_returns(tmp_path, monkeypatch):
    _slow(monkeypatch, 0.3)
    w = torch.arange(1000, dtype=torch.float32)
    state = {"w": w, "nested": {"n": [w * 2, 3]}, "step": 1}
    handle = checkpoint.save(state, tmp_path, 1, async_save=True)
    assert not handle.done() and checkpoint.list_checkpoints(tmp_path) == []  # not visible until durable
    w.add_(1000)  # training goes on and updates parameters in place
    state["nested"]["n"][0].zero_()
    assert handle.wait() == tmp_path / "step-00000001" and handle.done()
    loaded, step = checkpoint.load_latest(tmp_path)
    assert step == 1 and torch.equal(loaded["w"], torch.arange(1000, dtype=torch.float32))
    assert torch.equal(loaded["nested"]["n"][0], torch.arange(1000, dtype=torch.float32) * 2)
    assert loaded["nested"]["n"][1] == 3 and loaded["step"] == 1


def test_one_write_in_flight_the_next_save_waits_and_says_so(tmp_path, monkeypatch, caplog):
    _slow(monkeypatch, 0.3)
    before = checkpoint.stats()
    first = checkpoint.save({"w": torch.ones(3)}, tmp_path, 1, async_save=True)
    with caplog.at_level(logging.WARNING, logger="npudist.checkpoint"):
        second = checkpoint.save({"w": torch.ones(3) * 2}, tmp_path, 2, async_save=True)
    assert first.done()  # the second save started only once the first write had finished
    assert checkpoint.stats().waits == before.waits + 1 and checkpoint.stats().inflight == 1
    assert "checkpoint step 1 was still being written" in caplog.text and "waited" in caplog.text
    second.wait()
    assert checkpoint.list_checkpoints(tmp_path) == [2, 1] and checkpoint.stats().inflight == 0


@pytest.mark.parametrize(("err", "text"),
                         [(errno.ENOSPC, "no space left on the device"), (errno.EACCES, "permission denied")])
def test_a_background_failure_is_raised_by_the_next_save_and_keeps_the_previous(tmp_path, monkeypatch, err, text):
    checkpoint.save({"w": torch.ones(3)}, tmp_path, 5, async_save=True).wait()
    before_bytes = (tmp_path / "step-00000005" / "state.pt").read_bytes()
    failures = checkpoint.stats().failures
    monkeypatch.setattr(torch, "save", _failing_save(err))
    handle = checkpoint.save({"w": torch.zeros(3)}, tmp_path, 6, async_save=True)  # returns: the write is later
    handle._join()
    monkeypatch.undo()
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.save({"w": torch.zeros(3)}, tmp_path, 7, async_save=True)
    message = str(caught.value)
    assert "step 6" in message and text in message and "previous checkpoint (step 5) is untouched" in message
    assert checkpoint.stats().failures == failures + 1
    assert checkpoint.list_checkpoints(tmp_path) == [5] and not list(tmp_path.glob(".tmp-*"))
    assert (tmp_path / "step-00000005" / "state.pt").read_bytes() == before_bytes
    # Raised once: the save after it works again.
    checkpoint.save({"w": torch.zeros(3)}, tmp_path, 8, async_save=True).wait()
    assert checkpoint.load_latest(tmp_path)[1] == 8


def test_shutdown_waits_for_the_last_write_and_raises_its_failure(tmp_path, monkeypatch):
    npudist.init()
    _slow(monkeypatch, 0.2)
    checkpoint.save({"w": torch.ones(3)}, tmp_path, 1, async_save=True)
    npudist.shutdown()  # waits: the checkpoint is there afterwards
    assert checkpoint.list_checkpoints(tmp_path) == [1]
    npudist.init()
    monkeypatch.setattr(torch, "save", _failing_save(errno.ENOSPC))
    checkpoint.save({"w": torch.ones(3)}, tmp_path, 2, async_save=True)
    with pytest.raises(checkpoint.CheckpointError, match="step 2: no space left"):
        npudist.shutdown()
    assert not dist.is_initialized()  # the teardown finished before the error was raised
    assert checkpoint.list_checkpoints(tmp_path) == [1]


def test_handle_wait_raises_the_error_once(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", _failing_save(errno.ENOSPC))
    handle = checkpoint.save({"w": torch.ones(3)}, tmp_path, 1, async_save=True)
    with pytest.raises(checkpoint.CheckpointError, match="no earlier checkpoint exists"):
        handle.wait()
    monkeypatch.undo()
    checkpoint.save({"w": torch.ones(3)}, tmp_path, 2, async_save=True).wait()  # not raised a second time


@pytest.mark.skipif(not compat.has("dcp_async_save"), reason="DCP async_save arrived in torch 2.3")
def test_sharded_async_save_round_trips_in_one_process(tmp_path):
    state = {"w": torch.arange(6, dtype=torch.float32), "b": torch.ones(2)}
    handle = checkpoint.save(state, tmp_path, 3, sharded=True, async_save=True)
    state["w"].zero_()
    handle.wait()
    template = {"w": torch.zeros(6), "b": torch.zeros(2)}
    loaded, step = checkpoint.load_latest(tmp_path, template=template)
    assert step == 3 and loaded["w"].tolist() == [0, 1, 2, 3, 4, 5]


def test_metrics_count_what_the_saves_did(tmp_path):
    before = checkpoint.stats()
    checkpoint.save({"w": torch.ones(1000)}, tmp_path, 1, async_save=True).wait()
    checkpoint.save({"w": torch.ones(1000)}, tmp_path, 2)
    on_disk = sum(f.stat().st_size for d in ("step-00000001", "step-00000002") for f in (tmp_path / d).iterdir())
    fams = {f.name: f for f in CheckpointCollector(CollectorHealth(), ["0", "0", "h", "cpu", "0", "r1"]).collect()}
    assert sum(s.value for s in fams["npudist_checkpoint_bytes"].samples) == before.bytes + on_disk
    count = {s.name: s.value for s in fams["npudist_checkpoint_write_duration_seconds"].samples}
    assert count["npudist_checkpoint_write_duration_seconds_count"] == before.write.count + 2
    snap = {s.name: s.value for s in fams["npudist_checkpoint_snapshot_duration_seconds"].samples}
    assert snap["npudist_checkpoint_snapshot_duration_seconds_count"] == before.snapshot.count + 2
    assert fams["npudist_checkpoint_inflight"].samples[0].value == 0


def test_a_broken_stats_source_is_counted_not_raised():
    health = CollectorHealth()

    def broken():
        raise RuntimeError("boom")

    assert list(CheckpointCollector(health, ["0", "0", "h", "cpu", "0", "r1"], stats=broken).collect()) == []
    assert health.errors("checkpoint") == {"error": 1}


@pytest.mark.subprocess
def test_a_normal_exit_without_shutdown_waits_for_the_last_write(tmp_path):
    from tests.conftest import child_env, run_py

    script = ("import sys, torch; from npudist import checkpoint; "
              "checkpoint.save({'w': torch.ones(3)}, sys.argv[1], 4, async_save=True)")
    done = run_py(["-c", script, str(tmp_path)], env=child_env({store.TEST_DELAY_VAR: "0.5"}), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert checkpoint.list_checkpoints(tmp_path) == [4] and checkpoint.load_latest(tmp_path)[1] == 4


def test_save_reads_no_test_variable_the_writer_holds_the_slow_disk(tmp_path, monkeypatch):
    monkeypatch.setenv(store.TEST_DELAY_VAR, "60")  # set after this process's writer was made: not read
    handle = checkpoint.save({"w": torch.ones(4)}, tmp_path, 1, async_save=True)
    assert handle.wait(timeout=20) == tmp_path / "step-00000001"


def test_a_launched_process_reads_the_slow_disk_once_from_its_environment():
    env = {store.TEST_DELAY_VAR: " 0.5 ", store.SYNC_DELAY_VAR: "2"}
    assert SlowDisk.from_env(env) == SlowDisk(background_s=0.5, sync_s=2.0)
    assert SlowDisk.from_env({}) == SlowDisk()
    with pytest.raises(ValueError, match="NPUDIST_TEST_CHECKPOINT_DELAY_S='slow' is not a number of seconds"):
        SlowDisk.from_env({store.TEST_DELAY_VAR: "slow"})
