"""The process-group watch counts every collective per group, whoever issues it, once each."""

from __future__ import annotations

import json

import pytest
import torch

from npudist.comm import pg_watch
from npudist.diagnosis.record import encode_ranks, parse_group
from tests.conftest import REPO, child_env, run_npudist, run_py


def test_the_kernels_table_becomes_one_count_per_group():
    # Header: total, latest slot, waits, groups; then per group: entered, done, p2p in, p2p done, op, bytes, since.
    table = torch.tensor([[9, 1, 0, 2, 0, 0, 0, 0],
                          [5, 5, 1, 1, 0, 64, 2_000_000_000, 0],
                          [3, 2, 0, 0, 1, 4096, 1_000_000_000, 0]])
    snap = pg_watch.parse(table, ["0", "mesh"], ["c10d::allreduce_", "c10d::_allgather_base_"])
    world, mesh = snap.groups
    assert (world.name, world.entered, world.done, world.p2p_entered, world.op, world.nbytes) == \
        ("0", 5, 5, 1, "all_reduce", 64)  # torch.distributed's names, as the script calls them
    assert (mesh.op, mesh.since, mesh.in_flight) == ("all_gather_into_tensor", 1.0, True)
    assert snap.total == 9 and snap.waiting and snap.current() is mesh  # the call still in flight
    idle = pg_watch.parse(torch.tensor([[5, 0, 0, 1, 0, 0, 0, 0], [5, 5, 0, 0, 0, 8, 3_000_000_000, 0]]), ["0"],
                          ["c10d::broadcast_"])
    assert not idle.waiting and idle.current().op == "broadcast"  # none in flight: the last one


def test_a_functional_collectives_wait_counts_as_waiting():
    snap = pg_watch.parse(torch.tensor([[1, 0, 1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 8, 0, 0]]), ["0"],
                          ["_c10d_functional::all_reduce"])
    assert snap.waiting and snap.groups[0].op == "all_reduce"


@pytest.mark.parametrize(("ranks", "doc"), [
    ([0, 1, 2, 3], {"start": 0, "step": 1, "count": 4}),
    ([1, 3, 5, 7], {"start": 1, "step": 2, "count": 4}),  # a DeviceMesh dimension: O(1) bytes at any size
    ([0, 2, 3], {"ranks": [0, 2, 3]}),
    ([5], {"ranks": [5]}),
])
def test_group_members_are_published_compactly_and_read_back(ranks, doc):
    assert encode_ranks(ranks) == doc
    info = parse_group("7", json.dumps({**doc, "desc": "mesh_shard"}))
    assert info is not None and list(info.ranks) == ranks and "mesh dimension 'shard' 7" in info.label


@pytest.mark.parametrize("raw", ['{"start": 0, "step": 0, "count": 4}', '{"start": -1, "step": 1, "count": 2}',
                                 '{"ranks": [0, "1"]}', '{"ranks": []}', '{"start": 0, "step": 1, "count": 99999999}',
                                 "[1, 2]", "not json", '{"ranks": [true]}'])
def test_a_published_group_that_is_not_one_is_ignored(raw):
    assert parse_group("g", raw) is None


@pytest.mark.subprocess
def test_without_a_compiler_the_watch_is_off_with_the_reason_and_nothing_raises(tmp_path):
    code = ("from npudist.comm import pg_watch\n"
            "print(pg_watch.load(), '|', pg_watch.why_off())\n")
    out = run_py(["-c", code], env=child_env({"CXX": "/bin/false", pg_watch.CACHE_VAR: str(tmp_path)}))
    assert out.returncode == 0, out.stderr
    ok, why = out.stdout.strip().split(" | ", 1)
    assert ok == "False" and "building the process-group watch with /bin/false failed" in why
    assert "NPUDIST_PG_WATCH=off" not in why or "compiler" in why


@pytest.mark.ranks
@pytest.mark.slow
def test_every_door_to_a_collective_is_counted_once_on_its_own_group():
    """rank_pg_watch.py issues, in order: 3 all_reduce on the default group, 2 on a subgroup, 1 functional
    all_reduce, 1 send/recv, 1 npudist.comm.all_reduce, then one DDP step of a 1-bucket model."""
    out = run_npudist(["launch", "--nproc-per-node", "2", str(REPO / "tests/comm/rank_pg_watch.py")], timeout=180)
    decoder = json.JSONDecoder()
    docs = [decoder.raw_decode(part)[0] for part in out.stdout.split("COUNTS ")[1:]]
    assert out.returncode == 0 and len(docs) == 2, out.stderr[-3000:]
    for seen in docs:
        world, sub = "0", seen["subgroup_name"]
        assert seen["loaded"] is True and seen["start"] == {}
        assert seen["raw"] == {world: [3, 3, 0, 0]}
        assert seen["subgroup"] == {world: [3, 3, 0, 0], sub: [2, 2, 0, 0]}  # a subgroup moves only its own count
        assert seen["funcol"][world] == [4, 4, 0, 0]  # a functional collective once, not again for its c10d call
        assert seen["p2p"][world] == [4, 4, 1, 1]  # point-to-point apart: it does not shift the group's order
        assert seen["npudist"][world][0] == 5  # npudist's own door: once
        before, after = seen["ddp_step"]
        assert after[world][0] - before[world][0] == 1  # DDP's reducer: one bucket, one all_reduce


def test_a_torch_the_watch_was_not_measured_on_goes_without_it_and_says_so(monkeypatch):
    from npudist.runtime import compat

    for version in ((2, 1, 2), (2, 15, 0)):
        monkeypatch.setattr(compat, "TORCH", version)
        with pytest.raises(pg_watch.WatchUnavailable, match=r"measured on torch 2\.13 only"):
            pg_watch.build()


def test_only_groups_that_reach_the_dispatcher_are_left_to_the_watch():
    """The simulated hccl is a ProcessGroup written in Python: dist.all_reduce calls its method directly and no c10d
    op runs, so the watch would see nothing and npudist's own numbering must stay (measured: 0 calls counted for
    3 all_reduce and a DDP step under --simulate npu)."""
    import torch.distributed as dist

    from npudist.comm.pg_watch import dispatched as _dispatched

    class PythonGroup(dist.ProcessGroup):
        pass

    assert _dispatched(dist.ProcessGroup(0, 1)) and not _dispatched(PythonGroup(0, 1))
