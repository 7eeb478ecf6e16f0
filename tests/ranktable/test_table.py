"""`npudist ranktable check` on a hand-written 2x8 table (the HCCL guide's shape) and on the mistakes users
make: each refused with the field named."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from npudist.cli import app
from npudist.ranktable import check
from tests.conftest import FAKES

VALID = json.loads((FAKES / "ranktable" / "2x8-v1.0.json").read_text())


def _fields(table) -> list[str]:
    return [d.field for d in check(table)]


def test_the_valid_2x8_table_has_no_defect():
    assert check(VALID) == []


def _with(edit) -> dict:
    table = copy.deepcopy(VALID)
    edit(table)
    return table


def _set(path: str, value):
    def edit(table):
        *head, last = path.split(".")
        node = table
        for part in head:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value
    return edit


BAD = [
    # (edit, the one field that must be named, words of the problem)
    (_set("server_list.1.device.3.device_ip", "-.-.-.-"), "server_list[1].device[3].device_ip", "no address"),
    (_set("server_list.1.device.0.rank_id", "3"), "server_list[0].device[3].rank_id", "also given"),
    (_set("server_list.0.server_id", "127.0.1.1"), "server_list[0].server_id", "loopback"),
    (_set("status", "initializing"), "status", "completed"),
    (_set("server_count", "3"), "server_count", "server_list has 2"),
    (_set("server_list.0.device.7.rank_id", "16"), "server_list[0].device[7].rank_id", "outside 0..15"),
    (_set("server_list.1.device.2.device_ip", "192.168.102.11"), "server_list[0].device[2].device_ip",
     "used by 2 devices"),
    (_set("server_list.1.server_id", "10.20.0.11"), "server_list[1].server_id", "appears 2 times"),
    (_set("version", "1.1"), "version", "not one of"),
    (_set("server_list.0.device.1.device_id", "0"), "server_list[0].device[1].device_id", "listed twice"),
]


@pytest.mark.parametrize(("edit", "field", "words"), BAD, ids=[b[1] for b in BAD])
def test_each_defect_names_its_field(edit, field, words):
    defects = check(_with(edit))
    named = [d for d in defects if d.field == field]
    assert named, [d.line() for d in defects]
    assert words in named[0].problem and named[0].fix


def test_a_duplicated_rank_names_both_devices():
    fields = _fields(_with(_set("server_list.1.device.0.rank_id", "3")))
    assert fields == ["server_list[0].device[3].rank_id", "server_list[1].device[0].rank_id"]


@pytest.mark.parametrize("doc", [[], "x", {"status": "completed", "version": "1.0", "server_count": "1"}])
def test_wrong_shapes_are_defects_not_crashes(doc):
    assert check(doc)


def _pods(order: list[tuple[str, list[int]]]) -> dict:
    """A 1.2 table of four 2-device servers in two SuperPoDs; ``order`` gives each server's pod and ranks."""
    servers = [{"server_id": f"10.1.0.{i + 1}", "host_ip": f"10.1.0.{i + 1}",
                "device": [{"device_id": str(d), "super_device_id": str(i * 2 + d), "device_ip": f"192.168.{d}.{i + 1}",
                            "rank_id": str(r)} for d, r in enumerate(ranks)]}
               for i, (_, ranks) in enumerate(order)]
    pods: dict[str, list] = {}
    for i, (pod, _) in enumerate(order):
        pods.setdefault(pod, []).append({"server_id": f"10.1.0.{i + 1}"})
    return {"status": "completed", "version": "1.2", "server_count": str(len(servers)), "server_list": servers,
            "super_pod_list": [{"super_pod_id": p, "server_list": s} for p, s in pods.items()]}


def test_a_superpod_table_with_contiguous_ranks_passes():
    assert check(_pods([("0", [0, 1]), ("0", [2, 3]), ("1", [4, 5]), ("1", [6, 7])])) == []


def test_superpod_ranks_interleaved_across_pods_are_refused():
    defects = check(_pods([("0", [0, 1]), ("1", [2, 3]), ("0", [4, 5]), ("1", [6, 7])]))
    assert [d.field for d in defects] == ["super_pod_list[0]", "super_pod_list[1]"]
    assert "0,1,4,5, not one contiguous run" in defects[0].problem


def test_a_superpod_table_needs_host_ip_and_super_device_id():
    table = _pods([("0", [0, 1]), ("0", [2, 3])])
    table["server_list"][1]["host_ip"] = "127.0.1.1"
    del table["server_list"][0]["device"][1]["super_device_id"]
    assert _fields(table) == ["server_list[0].device[1].super_device_id", "server_list[1].host_ip"]


def test_check_on_the_command_line(tmp_path):
    good = FAKES / "ranktable" / "2x8-v1.0.json"
    res = CliRunner().invoke(app, ["ranktable", "check", str(good)])
    assert res.exit_code == 0 and "ok, version 1.0, 2 servers, 16 ranks" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_with(_set("server_list.1.device.3.device_ip", "-.-.-.-"))))
    res = CliRunner().invoke(app, ["ranktable", "check", str(bad)])
    assert res.exit_code == 1
    assert "defect  server_list[1].device[3].device_ip: is '-.-.-.-'" in res.output and "hccn_tool -i" in res.output
    (tmp_path / "half.json").write_text('{"status": ')
    res = CliRunner().invoke(app, ["ranktable", "check", str(tmp_path / "half.json")])
    assert res.exit_code == 2 and "is not JSON" in res.output
