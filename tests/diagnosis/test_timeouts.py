"""The ranks' timeouts compared (diagnosis/timeouts.py), on recorded values, and rank 0's one read of them
through a store (comm/hang/agree.py)."""

from __future__ import annotations

import io
import json

import pytest

from npudist.diagnosis import timeouts
from npudist.diagnosis.timeouts import UNSET, disagreements, line, mine


def test_only_the_set_timeouts_are_published():
    env = {"HCCL_EXEC_TIMEOUT": " 1800 ", "HCCL_CONNECT_TIMEOUT": "", "PATH": "/bin", "NPUDIST_TIMEOUT": "900"}
    assert mine(env) == {"HCCL_EXEC_TIMEOUT": "1800", "NPUDIST_TIMEOUT": "900"}


def test_equal_values_on_every_rank_say_nothing():
    values = {r: {"HCCL_EXEC_TIMEOUT": "1800", "HCCL_CONNECT_TIMEOUT": "600"} for r in range(8)}
    assert disagreements(values) == []
    assert line(disagreements(values)) is None
    assert line(disagreements({r: {} for r in range(8)})) is None  # unset everywhere is equal too


def test_the_rank_that_differs_from_the_majority_is_named_with_its_host_and_the_fix():
    values = {r: {"HCCL_EXEC_TIMEOUT": "1800"} for r in range(16)}
    values[11] = {"HCCL_EXEC_TIMEOUT": "600"}
    found = disagreements(values)
    assert [(d.var, d.majority, d.odd) for d in found] == [("HCCL_EXEC_TIMEOUT", "1800", (("600", (11,)),))]
    said = line(found, {11: "node-b"})
    assert "HCCL_EXEC_TIMEOUT is 1800 on 15 ranks but 600 on rank 11 (node-b)" in said
    assert "export HCCL_EXEC_TIMEOUT=1800" in said and "the job goes on" in said


def test_a_node_without_the_variable_differs_from_nodes_that_set_it():
    # Node 1 (ranks 8-15) never sourced the profile that sets it: its ranks run on HCCL's default.
    values = {r: ({"HCCL_CONNECT_TIMEOUT": "1200"} if r < 8 else {}) for r in range(16)}
    values[0] = {}  # a tie (8 against 8) goes to the value of the lowest rank: rank 0's
    (d,) = disagreements(values)
    assert d.majority == UNSET and d.odd == (("1200", tuple(range(1, 8))),)
    assert "unset HCCL_CONNECT_TIMEOUT" in line([d])


def test_several_values_and_variables_each_get_their_part_and_long_lists_are_counted():
    values = {r: {"HCCL_EXEC_TIMEOUT": "1800", "NPUDIST_TIMEOUT": "600"} for r in range(8192)}
    for r in range(100, 130):
        values[r] = {"HCCL_EXEC_TIMEOUT": "900", "NPUDIST_TIMEOUT": "600"}
    values[5000] = {"HCCL_EXEC_TIMEOUT": "1836", "NPUDIST_TIMEOUT": "1200"}
    found = disagreements(values)
    assert [d.var for d in found] == ["HCCL_EXEC_TIMEOUT", "NPUDIST_TIMEOUT"]
    assert found[0].odd == (("900", tuple(range(100, 130))), ("1836", (5000,)))
    said = line(found)
    assert "900 on ranks 100, 101, 102, 103, 104, 105, 106, 107 and 22 more; 1836 on rank 5000" in said
    assert "NPUDIST_TIMEOUT is 600 on 8191 ranks but 1200 on rank 5000" in said


def _store():
    import torch.distributed as dist

    return dist.HashStore()


def test_rank_0_reads_every_rank_once_all_have_published(monkeypatch):
    from npudist.comm.hang import agree
    from npudist.comm.hang.store import who_key

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    store = _store()
    out = io.StringIO()
    check = agree.TimeoutsCheck(3, out=out)
    agree.publish(store, 0, {"HCCL_EXEC_TIMEOUT": "1800"})
    agree.publish(store, 1, {"HCCL_EXEC_TIMEOUT": "1800"})
    assert check.tick(store) is False  # rank 2 not in yet: nothing read, nothing said
    store.set(who_key(2), json.dumps({"host": "node-c", "pid": 7}))
    agree.publish(store, 2, {"HCCL_EXEC_TIMEOUT": "600"})
    assert check.tick(store) is True
    assert out.getvalue().count("\n") == 1
    assert "600 on rank 2 (node-c)" in out.getvalue()


def test_equal_ranks_print_nothing_and_a_store_fault_drops_the_comparison():
    from npudist.comm.hang import agree

    store = _store()
    out = io.StringIO()
    for r in range(2):
        agree.publish(store, r, {"HCCL_CONNECT_TIMEOUT": "600"})
    assert agree.TimeoutsCheck(2, out=out).tick(store) is True
    assert out.getvalue() == ""

    class Broken:
        def add(self, key, n):
            raise RuntimeError("store gone")

    assert agree.TimeoutsCheck(2, out=out).tick(Broken()) is True and out.getvalue() == ""


def test_rank_0_gives_up_on_ranks_that_never_publish():
    from npudist.comm.hang import agree

    now = [0.0]
    check = agree.TimeoutsCheck(2, out=io.StringIO(), clock=lambda: now[0])
    store = _store()
    agree.publish(store, 0, {})
    assert check.tick(store) is False
    now[0] = agree.WAIT_S + 1
    assert check.tick(store) is True and check.said is None


@pytest.mark.parametrize("var", [v for v, _ in timeouts.TIMEOUT_VARS])
def test_every_row_is_compared(var):
    (d,) = disagreements({0: {var: "1"}, 1: {var: "1"}, 2: {var: "2"}})
    assert d.var == var and d.odd == (("2", (2,)),)


def _job(rank1_value: str) -> str:
    """Rank 0's output of a 2-rank gloo job where both ranks set HCCL_EXEC_TIMEOUT=1800 and rank 1 may override."""
    from tests.conftest import run_ranks

    return run_ranks("tests/comm/rank_timeouts.py", [rank1_value], timeout=90,
                     env={"HCCL_EXEC_TIMEOUT": "1800", "NPUDIST_PG_WATCH": "off"})[0]


@pytest.mark.slow
@pytest.mark.ranks
def test_a_two_rank_job_names_the_rank_with_another_timeout_and_says_nothing_when_equal():
    differs = _job("600")
    said = [ln for ln in differs.splitlines() if "timeouts differ" in ln]
    assert len(said) == 1, differs[-3000:]
    assert "HCCL_EXEC_TIMEOUT is 1800 on 1 rank but 600 on rank 1" in said[0]
    equal = _job("-")
    assert "timeouts differ" not in equal, equal[-3000:]
