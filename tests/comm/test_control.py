"""npudist's own control messages (comm/control.py) on a backend that serves a device type only.

HCCL and NCCL groups refuse CPU tensors ("No backend type associated with device type cpu"), so a flag
sent as a CPU tensor kills the first NPU job at its first synchronous checkpoint. ``fakeccl``
(tests/fakes/device_only.py) is registered for the ``fakedev`` device alone and refuses the same way;
two real ranks on it take the run-dir lock, save checkpoints, run an ensemble and shut down through the door.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from npudist.checkpoint import RunDirLock
from npudist.comm import control
from npudist.runtime import compat
from tests.conftest import REPO, run_ranks

RANK = str(REPO / "tests" / "comm" / "rank_control.py")
REFUSAL = "No backend type associated with device type cpu"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Both ranks' records of one two-rank job on fakeccl (each step's result or error)."""
    if not compat.has("python_privateuse1"):
        pytest.skip("the device-only fake backend registers a Python PrivateUse1 device (torch >= 2.10)")
    root = tmp_path_factory.mktemp("control")
    out, run_dir, busy = root / "out", root / "run", root / "busy"
    out.mkdir()
    holder = RunDirLock(busy)  # another job's lock: both ranks must hear rank 0's refusal
    holder.acquire()
    try:
        run_ranks(RANK, [str(out), str(run_dir), str(busy)], pythonpath=[REPO])
    finally:
        holder.release()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _ok(record: dict, step: str) -> object:
    assert "error" not in record[step], f"{step}: {record[step]['error']}\n{record[step]['trace']}"
    return record[step]["ok"]


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_the_lock_outcome_reaches_every_rank_on_a_device_only_backend(ranks, rank):
    rec = ranks[rank]
    assert REFUSAL not in rec["busy"].get("error", "")
    assert rec["busy"]["error"].startswith("RunDirBusy: run directory ")  # rank 0's refusal, on every rank
    assert _ok(rec, "lock") is (rank == 0)


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_checkpoint_save_agrees_on_failures_over_the_groups_device(ranks, rank):
    rec = ranks[rank]
    saved, saved_async = _ok(rec, "save"), _ok(rec, "save_async")
    if rank == 0:  # rank 0 writes plain state and returns the directory
        assert saved.endswith("/step-00000001") and saved_async.endswith("/step-00000002")
    else:
        assert (saved, saved_async) == ("None", "None")


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_the_door_sends_control_tensors_on_the_groups_device(ranks, rank):
    rec = ranks[rank]
    assert _ok(rec, "device") == "fakedev"
    assert _ok(rec, "any_rank") is True  # rank 1 raised it
    assert _ok(rec, "from_rank") is True  # rank 0's value
    assert _ok(rec, "gather_rows") == [[[0.0, 0.5], [1.0, 0.5]], rank]
    assert _ok(rec, "shutdown") is None  # the shutdown barrier went through the door too
    assert rec["initialized_after"] is False


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_the_ensemble_sends_its_host_tensors_on_the_groups_device(ranks, rank):
    assert _ok(ranks[rank], "ensemble") == 2
    assert _ok(ranks[rank], "gather_floats") == [0.0, 1.0]


def test_gloo_keeps_control_data_on_the_host_without_another_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert control.device() == torch.device("cpu")
        assert control.any_rank(True) is True and control.from_rank(False) is False
        assert control.gather_rows([1.0, 2.0]) == ([[1.0, 2.0]], 0)
        control.barrier(timedelta(seconds=5))
        assert control.broadcast_object(("busy", "x")) == ("busy", "x")
        assert dist.distributed_c10d._world.group_count == 1  # no side group was made for any of it
    finally:
        dist.destroy_process_group()


def test_without_a_process_group_control_messages_are_local():
    assert not dist.is_initialized()
    assert control.any_rank(True) is True and control.from_rank(False) is False
    assert control.broadcast_object(3) == 3 and control.rank() == 0
