"""Hang diagnosis against hostile store records: a bad record is reported as such, the original error survives."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from npudist.comm.hang import failure, watchdog
from npudist.comm.hang.watchdog import CollectiveHangError, Watchdog
from npudist.comm.state import state as comm_state
from npudist.comm.watched import watched
from npudist.diagnosis.record import BadRecord, Record, parse_record

GOOD = {"rank": 1, "seq": 3, "step": 2, "op": "all_reduce", "nbytes": 64, "state": "done", "wall_time": 1.0,
        "group": "1", "gseq": 2, "groups": {"0": 1, "1": 2}}


@pytest.mark.parametrize(("raw", "words"), [
    (json.dumps({**GOOD, "seq": "3"}), "seq"),
    (json.dumps({**GOOD, "seq": True}), "seq"),
    (json.dumps({**GOOD, "wall_time": "yesterday"}), "wall_time"),
    (json.dumps({**GOOD, "op": 7, "nbytes": None}), "op, nbytes"),
    ('{"rank": 1, "seq": 3, "step": 0, "op": "x", "nbytes": 1, "state": "done", "wall_time": NaN, "group": "",'
     ' "gseq": 0, "groups": {}}', "wall_time"),
    (json.dumps({**GOOD, "groups": {"0": "1"}}), "groups must map"),
    (json.dumps({**GOOD, "groups": {str(i): i for i in range(65)}}), "at most 64"),
    (json.dumps({**GOOD, "groups": [1, 2]}), "groups"),
    (json.dumps({**GOOD, "extra": 1}), "expected an object"),
    (json.dumps([GOOD]), "expected an object"),
    ('{"seq": ' + "9" * 5000 + "}", "not JSON"),
    ("[" * 100_000, "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (json.dumps({**GOOD, "rank": 0}), "names rank 0"),
])
def test_bad_records_say_what_is_wrong(raw, words):
    rec = parse_record(raw, 1)
    assert isinstance(rec, BadRecord) and words in rec.reason


def test_good_record():
    assert parse_record(json.dumps(GOOD), 1) == Record(**GOOD)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(GOOD)), st.none() | st.booleans() | st.integers() | st.floats()
                       | st.text(max_size=4), max_size=10).map(json.dumps) | st.binary(max_size=40))
def test_parse_record_never_raises(raw):
    assert isinstance(parse_record(raw, 1), Record | BadRecord)


class FakeStore:
    def __init__(self, records: dict[int, str]) -> None:
        self.data = {watchdog._key(r): v.encode() for r, v in records.items()}

    def check(self, keys):
        return all(k in self.data for k in keys)

    def get(self, key):
        return self.data[key]


@pytest.fixture
def two_ranks(monkeypatch):
    """A Watchdog of rank 0 in a 2-rank world whose store holds rank 1's record as the test sets it."""
    monkeypatch.setattr(watchdog, "PUBLISH_INTERVAL_S", 0.0)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
    wd = Watchdog()
    wd.record = Record(rank=0, seq=5, op="all_reduce", nbytes=64, state="entered", wall_time=1.0)
    monkeypatch.setattr(wd, "_publish", lambda: None)

    def with_store(rank1: str) -> Watchdog:
        monkeypatch.setattr(wd, "_connect", lambda: FakeStore({1: rank1}))
        return wd

    return with_store


def test_a_wrong_typed_record_is_reported_as_bad_with_the_cause(two_ranks):
    wd = two_ranks(json.dumps({**GOOD, "seq": "5", "wall_time": None}))
    err = wd.diagnose("all_reduce", 5, 64, RuntimeError("Connection closed by peer"))
    assert isinstance(err, CollectiveHangError)
    assert "rank 1: bad record in the store (wrong type or value for seq, wall_time)" in str(err)
    assert "Connection closed by peer" in str(err)
    assert err.report["not_reached"] == [1] and "bad_record" in err.report["ranks"]["1"]


def test_a_diagnosis_that_fails_never_replaces_the_original_error(two_ranks, monkeypatch):
    wd = two_ranks(json.dumps({**GOOD, "seq": 2}))
    monkeypatch.setattr(comm_state(), "watchdog", wd)
    monkeypatch.setattr(wd, "enter", lambda op, nbytes: 5)

    def boom(*a, **k):
        raise TypeError("a diagnosis bug")

    monkeypatch.setattr(failure, "describe", boom)

    def collective():
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        watched("all_reduce", collective)()
