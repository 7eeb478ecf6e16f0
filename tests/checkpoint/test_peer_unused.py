"""Under `launch --peer-snapshots K`, a rank whose job never sends a copy says so once after 2K steps, and
its checkpoint stats carry the copy's age, which NpudistNoFreshPeerSnapshot (age above 2K) alerts on."""

from __future__ import annotations

import io
import types

import pytest
import torch

import npudist
from npudist.checkpoint import peer_unused, stats
from npudist.checkpoint.peer import EVERY_VAR, HOLDER_VAR
from npudist.checkpoint.peer_unused import UnusedWatch


@pytest.fixture
def runtime():
    yield
    npudist.shutdown()


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)


def test_rank_0_says_once_after_2k_steps_without_a_copy():
    out, sent = io.StringIO(), False
    watch = UnusedWatch(3, 0, sent=lambda: sent, out=out)
    opt = _optimizer()
    try:
        for _ in range(5):
            opt.step()
        assert out.getvalue() == ""  # 5 < 2K = 6
        opt.step()
        assert "6 optimizer steps have run under `npudist launch --peer-snapshots 3`" in out.getvalue()
        assert "no rank sent a peer snapshot" in out.getvalue()
        for _ in range(10):
            opt.step()
        assert out.getvalue().count("no rank sent") == 1
        assert (watch.stats().age_steps, watch.stats().every) == (16, 3)
    finally:
        watch.close()


def test_other_ranks_count_but_stay_silent_and_a_script_that_sends_is_left_alone():
    out = io.StringIO()
    quiet = UnusedWatch(1, 1, sent=lambda: False, out=out)
    sending = UnusedWatch(1, 0, sent=lambda: True, out=out)
    opt = _optimizer()
    try:
        for _ in range(4):
            opt.step()
        assert out.getvalue() == ""
        assert quiet.told and quiet.stats().age_steps == 4
        # stopped counting once it saw a copy sent (its hook stays until close: torch iterates the global step
        # hooks while calling them, so removing one from inside broke the step with "mutated during iteration")
        assert sending._done and sending.stats().age_steps == 2
    finally:
        quiet.close()
        sending.close()


def test_a_second_optimizer_stepping_in_the_same_loop_does_not_double_the_count():
    watch = UnusedWatch(10, 1, sent=lambda: False, out=io.StringIO())
    a, b = _optimizer(), _optimizer()
    try:
        for _ in range(3):
            a.step()
            b.step()
        assert watch.stats().age_steps == 3
    finally:
        watch.close()


def test_started_only_under_launch_peer_snapshots_and_its_age_reaches_the_exporter(runtime):
    assert peer_unused.start(0, {}) is None
    assert peer_unused.start(0, {HOLDER_VAR: "127.0.0.1:1", EVERY_VAR: "0"}) is None
    watch = peer_unused.start(0, {HOLDER_VAR: "127.0.0.1:1", EVERY_VAR: "2"})
    assert watch is not None and peer_unused.start(0, {HOLDER_VAR: "127.0.0.1:1", EVERY_VAR: "2"}) is watch
    watch._out = io.StringIO()
    opt = _optimizer()
    for _ in range(5):
        opt.step()
    peer = stats().peer
    assert (peer.age_steps, peer.every) == (5, 2)  # above 2K: the alert's expression holds
    npudist.shutdown()
    assert watch._hook is None  # the Runtime's close removed the step hook


def test_a_sender_with_copies_reports_its_own_age(runtime):
    from npudist.checkpoint.writer import writer

    watch = peer_unused.start(0, {HOLDER_VAR: "127.0.0.1:1", EVERY_VAR: "2"})
    assert watch is not None
    w = writer()
    sender_stats = types.SimpleNamespace(snapshots=1)
    w.peer = types.SimpleNamespace(stats=sender_stats, snapshot_stats=lambda: "the sender's", close=lambda: None)
    assert stats().peer == "the sender's"
    sender_stats.snapshots = 0  # a sender that never sent: the rank's step count is the truthful age
    assert stats().peer.age_steps == 0 and stats().peer.every == 2
