"""`npudist launch` on an NPU says which way HCCL will build its communicators: the rank table (with its rank
count, or its first defect) or negotiation through the store."""

from __future__ import annotations

import json

from npudist.accelerators import BY_NAME, Accelerator
from npudist.launch import plan
from tests.conftest import FAKES


class _EightNpus(Accelerator):
    def device_count(self) -> int:
        return 8


NPU8 = _EightNpus(BY_NAME["npu"])
TABLE = FAKES / "ranktable" / "2x8-v1.0.json"


def _hccl_notes(env) -> list[str]:
    return [n for n in plan(["--nproc-per-node", "8", "train.py"], NPU8, env).notes if n.startswith("HCCL:")]


def test_a_rank_table_is_named_with_its_rank_count():
    assert _hccl_notes({"RANK_TABLE_FILE": str(TABLE)}) == [
        f"HCCL: rank table {TABLE}, 16 ranks (2 servers, version 1.0)"]


def test_without_a_table_the_store_negotiates():
    (note,) = _hccl_notes({})
    assert note.startswith("HCCL: store negotiation (RANK_TABLE_FILE unset")


def test_a_defective_or_missing_table_is_said_at_start(tmp_path):
    doc = json.loads(TABLE.read_text())
    doc["server_list"][0]["server_id"] = "127.0.1.1"
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps(doc))
    (note,) = _hccl_notes({"RANK_TABLE_FILE": str(bad)})
    assert "1 defect(s), first server_list[0].server_id: 127.0.1.1 is a loopback address" in note
    assert note.endswith(f"npudist ranktable check {bad}")
    (note,) = _hccl_notes({"RANK_TABLE_FILE": str(tmp_path / "none.json")})
    assert "unreadable: cannot read" in note


def test_other_accelerators_say_nothing_of_hccl():
    cpu = Accelerator(BY_NAME["cpu"])
    assert not [n for n in plan(["--nproc-per-node", "2", "t.py"], cpu, {}).notes if n.startswith("HCCL")]
