"""In-memory peer snapshots: the holder, the checksum on both ends, and the restart's choice of source.

In one process (no process group: the agreement collectives answer for this rank alone); the killed-rank
runs under torchrun are in test_peer_restart.py.
"""

import hashlib
import io
import threading
import time

import pytest
import torch

import npudist
from npudist.checkpoint import peer as peer_mod
from npudist.checkpoint import save
from npudist.checkpoint.peer_holder import Copy, Holder, serving
from npudist.checkpoint.peer_holder import request as signed_request

SECRET = bytes.fromhex("5e" * 32)


def request(address, header, payload=b"", **kw):
    return signed_request(address, header, payload, secret=SECRET, **kw)


def _state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(64, 32, generator=g)}, "step": step, "rng": torch.get_rng_state()}


@pytest.fixture
def runtime():
    yield
    npudist.shutdown()


def _sender(address: str) -> peer_mod.PeerSnapshots:
    from npudist.checkpoint.writer import writer

    w = writer()
    w.peer = peer_mod.PeerSnapshots(5, address, address, rank=0, world=1, partner=0, secret=SECRET)
    return w.peer


def _snap(p: peer_mod.PeerSnapshots, step: int) -> None:
    p.snapshot(_state(step), step)
    assert p._sent.wait(30)


def test_holder_refuses_bytes_that_do_not_match_and_keeps_the_last_two():
    h = Holder()
    good = b"x" * 100
    assert "sha256" in h.put(0, Copy(1, 2, hashlib.sha256(b"other").hexdigest(), good))
    for step in (1, 2, 3):
        assert h.put(0, Copy(step, 2, hashlib.sha256(good).hexdigest(), good)) is None
    assert [s for s, _, _ in h.listing(0, 2)] == [2, 3]
    assert h.listing(0, 4) == []  # another world size's copies are not offered
    assert h.listing(1, 2) == []


def test_restart_uses_the_newest_verified_copy_and_refuses_a_corrupted_one(runtime, tmp_path, caplog):
    with serving("127.0.0.1", secret=SECRET) as server:
        p = _sender(server.address)
        _snap(p, 5)
        _snap(p, 10)
        assert p.stats.snapshots == 2 and p.stats.last_step == 10 and p.stats.bytes > 64 * 32 * 4
        save(_state(3), tmp_path, 3)

        found = peer_mod.restore(tmp_path, p)
        assert (found.step, found.source) == (10, "local-memory")
        assert torch.equal(found.state["model"]["w"], _state(10)["model"]["w"])
        assert "source=local-memory step=10" in found.line

        # A bit flipped in the holder's memory after arrival: refused by the reader's checksum.
        bad = server.holder.get(0, 1, 10)
        flipped = bytearray(bad.payload)
        flipped[len(flipped) // 2] ^= 1
        with server.holder._lock:
            server.holder._copies[0][-1] = Copy(bad.step, bad.world, bad.sha256, bytes(flipped))
        found = peer_mod.restore(tmp_path, p)
        assert (found.step, found.source) == (5, "local-memory")
        assert torch.equal(found.state["model"]["w"], _state(5)["model"]["w"])
        assert "in-memory copy of step 10 refused: checksum mismatch" in caplog.text
        assert p.stats.recoveries == {"peer-memory": 0, "local-memory": 2, "disk": 0}


def test_disk_is_used_when_it_is_newer_or_the_holder_is_gone(runtime, tmp_path):
    with serving("127.0.0.1", secret=SECRET) as server:
        p = _sender(server.address)
        _snap(p, 5)
        save(_state(8), tmp_path, 8)
        found = peer_mod.restore(tmp_path, p)
        assert (found.step, found.source) == (8, "disk")
    # The holder's node is gone (its port closed): the disk checkpoint, said in one line.
    found = peer_mod.restore(tmp_path, p)
    assert (found.step, found.source) == (8, "disk")
    assert found.line.startswith("resume: source=disk step=8 ") and "no in-memory copy" in found.line


def test_a_copy_goes_to_the_partner_s_node_and_this_node_so_a_lost_partner_node_costs_nothing(runtime, tmp_path):
    with serving("127.0.0.1", secret=SECRET) as partner_node, serving("127.0.0.1", secret=SECRET) as this_node:
        from npudist.checkpoint.writer import writer

        p = peer_mod.PeerSnapshots(5, this_node.address, partner_node.address, rank=0, world=4, partner=2,
                                   secret=SECRET)
        writer().peer = p
        _snap(p, 5)
        assert [s for s, _, _ in partner_node.holder.listing(0, 4)] == [5]
        assert [s for s, _, _ in this_node.holder.listing(0, 4)] == [5]
        partner_node.close()  # the partner's node is lost; this node's ranks restart
        found = peer_mod.restore(tmp_path, p)
    assert (found.step, found.source) == (5, "local-memory")
    assert torch.equal(found.state["model"]["w"], _state(5)["model"]["w"])


def test_at_a_new_world_size_every_rank_resumes_from_rank_0_s_copy_as_from_disk(runtime, tmp_path):
    """An elastic job that lost a node runs at a smaller world: each rank's own copy is of the old world, and
    what a disk resume would load on every rank is rank 0's state (plain state has one writer, rank 0)."""
    with serving("127.0.0.1", secret=SECRET) as server:
        for owner, step in ((0, 15), (0, 20), (1, 20), (1, 25)):  # the old world of 4; rank 0's newest: 20
            buf = io.BytesIO()
            torch.save({**_state(step), "owner": owner}, buf)
            payload = buf.getvalue()
            reply, _ = request(server.address, {"op": "put", "owner": owner, "world": 4, "step": step,
                                                "sha256": hashlib.sha256(payload).hexdigest()}, payload)
            assert reply["ok"], reply
        save(_state(10), tmp_path, 10)
        from npudist.checkpoint.writer import writer

        p = peer_mod.PeerSnapshots(5, server.address, server.address, rank=1, world=2, partner=1, secret=SECRET)
        writer().peer = p
        found = peer_mod.restore(tmp_path, p)
    assert (found.step, found.source) == (20, "local-memory")
    assert found.state["owner"] == 0  # rank 0's copy, not this rank's own (older world, newer step 25)
    assert "rank 0's copy at world 4, now 2" in found.line


def test_at_an_unchanged_world_size_a_rank_never_resumes_from_another_rank_s_copy(runtime, tmp_path):
    """Rank 1's own copy is older than the disk checkpoint and rank 0's is newer, both of this world size:
    rank 0's copy would silently replace rank 1's own state (a shard, its RNG, its data position), so every
    rank resumes from disk instead (issue 46)."""
    with serving("127.0.0.1", secret=SECRET) as server:
        for owner, step in ((0, 20), (1, 10)):
            buf = io.BytesIO()
            torch.save({**_state(step), "owner": owner}, buf)
            payload = buf.getvalue()
            reply, _ = request(server.address, {"op": "put", "owner": owner, "world": 2, "step": step,
                                                "sha256": hashlib.sha256(payload).hexdigest()}, payload)
            assert reply["ok"], reply
        save({**_state(15), "owner": "disk"}, tmp_path, 15)
        from npudist.checkpoint.writer import writer

        p = peer_mod.PeerSnapshots(5, server.address, server.address, rank=1, world=2, partner=1, secret=SECRET)
        writer().peer = p
        found = peer_mod.restore(tmp_path, p)
    assert (found.step, found.source, found.state["owner"]) == (15, "disk", "disk")


def test_a_copy_that_arrives_damaged_is_refused_by_the_holder():
    with serving("127.0.0.1", secret=SECRET) as server:
        reply, _ = request(server.address, {"op": "put", "owner": 0, "world": 1, "step": 1,
                                            "sha256": hashlib.sha256(b"sent").hexdigest()}, b"snet")
        assert reply["ok"] is False and "sha256" in reply["error"]
        assert server.holder.listing(0, 1) == []


def test_closing_leaves_no_thread_or_port(runtime):
    before = {t.name for t in threading.enumerate()}
    with serving("127.0.0.1", secret=SECRET) as server:
        address = server.address
        p = _sender(address)
        _snap(p, 5)
    npudist.shutdown()
    assert not {t.name for t in threading.enumerate()} - before
    with pytest.raises(OSError):
        request(address, {"op": "list", "owner": 0, "world": 1}, timeout=5)


def test_the_exporter_shows_the_copy_s_age_size_blocking_time_and_recoveries(runtime, tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from npudist.telemetry.exposition.collector_health import CollectorHealth
    from npudist.telemetry.job.checkpoint_metrics import CheckpointCollector

    with serving("127.0.0.1", secret=SECRET) as server:
        p = _sender(server.address)
        for step in range(1, 8):
            if p.due(step):
                _snap(p, step)
        peer_mod.restore(tmp_path, p)  # from memory: step 5
        p.due(7)
        registry = CollectorRegistry()
        registry.register(CheckpointCollector(CollectorHealth(), ["0", "0", "n0", "cpu", "0", "r1"]))
        text = generate_latest(registry).decode()
    rank = 'chip="0",device="cpu",local_rank="0",node="n0",rank="0",run="r1"'  # the exposition sorts labels
    assert f"npudist_peer_snapshot_age_steps{{{rank}}} 2.0" in text  # step 7, copy of step 5
    assert f"npudist_peer_snapshot_bytes{{{rank}}} {float(p.stats.bytes)}" in text and p.stats.bytes > 0
    assert f'npudist_recoveries_total{{{rank},source="local-memory"}} 1.0' in text
    assert f'npudist_recoveries_total{{{rank},source="disk"}} 0.0' in text
    assert "npudist_peer_snapshot_blocking_seconds_total" in text


def test_the_step_waits_only_for_a_consistent_view_of_what_the_optimizer_changes(runtime, tmp_path, monkeypatch):
    """The parameters and optimizer state are cloned off the training loop: snapshot() returns before they
    are copied, the next optimizer step waits for that copy (counted as blocking), and the copy holds the
    values of the snapshot's step. A buffer, which a forward may change, is copied before snapshot() returns."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)

    def train_step():
        opt.zero_grad()
        model(torch.randn(16, 8)).square().mean().backward()
        opt.step()

    slow = peer_mod.pack

    def slow_copy(*args):
        time.sleep(0.5)
        return slow(*args)

    monkeypatch.setattr(peer_mod, "pack", slow_copy)
    with serving("127.0.0.1", secret=SECRET) as server:
        p = _sender(server.address)
        train_step()  # the optimizer steps once before the first snapshot: the sender knows it from then on
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        exp_avg = opt.state[model[0].weight]["exp_avg"].clone()
        held = p.snapshot({"model": model.state_dict(), "optim": opt.state_dict()}, 5)
        assert held < 0.4  # returned before the half-second copy of the parameters
        model[1].running_mean.add_(100.0)  # a buffer changes at once (as a forward's would): already copied
        train_step()  # waits for the copy, then changes parameters and optimizer state
        assert p._sent.wait(30)
        assert p.stats.blocking_seconds >= 0.3
        found = peer_mod.restore(tmp_path, p)
    assert found.step == 5
    for k, v in expected.items():
        assert torch.equal(found.state["model"][k], v), k
    assert torch.equal(found.state["optim"]["state"][0]["exp_avg"], exp_avg)
    assert not torch.equal(model[0].weight, expected["0.weight"])  # the step did run afterwards


def test_a_slow_holder_holds_no_step_and_piles_up_no_copies(runtime):
    """While one copy is being sent, the newest copy waits (one at most): older waiting ones are dropped and
    counted as skipped, and the holder ends with the first and the newest."""
    with serving("127.0.0.1", secret=SECRET) as server:
        p = _sender(server.address)
        gate, put = threading.Event(), p._put
        p._put = lambda *a: (gate.wait(30), put(*a))
        p.snapshot(_state(1), 1)
        deadline = time.monotonic() + 10
        while (p._waiting is not None or p._in_flight != 1 or not p._free.is_set()) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the writer took step 1 and waits on the holder
        try:
            for step in (2, 3, 4):
                assert p.snapshot(_state(step), step) < 5
                while (p._waiting or (0,))[0] != step and time.monotonic() < deadline:
                    time.sleep(0.01)  # serialised, hashed and waiting for the writer
            assert p._waiting[0] == 4 and p.stats.skipped == 2 and p._in_flight == 2
        finally:
            gate.set()
        assert p._sent.wait(30)
        assert [s for s, _, _ in server.holder.listing(0, 1)] == [1, 4] and p.stats.last_step == 4
