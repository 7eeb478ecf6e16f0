"""npudist.shutdown() ends everything a rank started, in one order, with nothing left running or open.

Two real gloo ranks start the lot (run-dir lock, metrics server and device poller, run log, an
asynchronous checkpoint) and call only npudist.shutdown(): afterwards no npudist thread is alive, the
metrics port refuses connections, the run log has its closing record and the lock names nobody.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.ranks]
RANK = str(REPO / "tests" / "runtime" / "rank_shutdown.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("shutdown")
    out, run_dir = root / "out", root / "run"
    out.mkdir()
    run_ranks(RANK, [str(out), str(run_dir)], env={"NPUDIST_METRICS_PORT": "0"})
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("rank", [0, 1])
def test_the_rank_had_started_threads_and_a_serving_port(ranks, rank):
    before = ranks[rank]["before"]
    assert before["served"] and before["port_open"]
    started = set(before["threads"])
    assert {"npudist-metrics", "npudist-watchdog"} <= started
    assert any(name.startswith("npudist-poll-") for name in started)  # the device poller
    assert ("npudist-checkpoint-writer" in started) is (rank == 0)  # plain checkpoints: rank 0 writes


@pytest.mark.parametrize("rank", [0, 1])
def test_shutdown_leaves_no_npudist_thread_and_no_open_port(ranks, rank):
    after = ranks[rank]["after"]
    assert after["threads"] == []
    assert after["port_open"] is False


@pytest.mark.parametrize("rank", [0, 1])
def test_shutdown_closed_the_run_log_and_released_the_lock(ranks, rank):
    after = ranks[rank]["after"]
    assert after["runlog_last"] == "comm"  # the closing record: the segment's collective totals
    assert after["lock_text"] == ""  # a released lock names nobody
