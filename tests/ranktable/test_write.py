"""`npudist ranktable write` on fake host trees (``/dev/davinciN``, ``/etc/hccn.conf``, the recorded
``hccn_tool -ip -g`` answers, the kernel's routes as ``ip`` prints them): two 8-device hosts become a table that
`check` accepts, each host named by its address on the interface towards the master."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from npudist.cli import app
from npudist.ranktable import RankTableError, build, check
from npudist.ranktable.node import parse_hccn_conf, visible_physical
from npudist.ranktable.read import ask_hccn, load, this_node
from npudist.runtime.network import route_to
from tests.conftest import FAKES, fakes_path

MASTER = "10.20.0.11"
HOSTS = {  # job interface eth1 on 10.20.0.0/24; docker0 and lo are the traps
    0: {"eth1": "10.20.0.11", "docker0": "172.17.0.1"},
    1: {"eth1": "10.20.0.12", "docker0": "172.17.0.1"},
}


def _tree(root: Path, host: int, devices=range(8), conf: bool = True) -> Path:
    (root / "dev").mkdir(parents=True)
    for d in devices:
        (root / "dev" / f"davinci{d}").touch()
    (root / "dev" / "davinci_manager").touch()  # not a device: must not be counted
    if conf:
        (root / "etc").mkdir()
        (root / "etc" / "hccn.conf").write_text("".join(
            f"address_{d}=192.168.{100 + d}.{11 + host}\nnetmask_{d}=255.255.255.0\nnetdetect_{d}=192.168.{100 + d}.1\n"
            for d in devices))
    return root


def _ip(host: int):
    """``ip`` as the kernel of host ``host`` answers it: the master is local on host 0, via eth1 on host 1."""
    addrs = HOSTS[host]

    def ip(args: list[str]) -> str:
        if args[:3] == ["-o", "route", "get"]:
            dest = args[3]
            if dest in addrs.values():
                return f"local {dest} dev lo table local src {dest} uid 0 \\    cache <local>\n"
            return f"{dest} dev eth1 src {addrs['eth1']} uid 0 \\    cache\n"
        lines = ["1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever"]
        lines += [f"{i + 2}: {name}    inet {a}/24 brd + scope global {name}\\       valid_lft forever"
                  for i, (name, a) in enumerate(addrs.items())]
        return "\n".join(lines) + "\n"

    return ip


def _node(root: Path, host: int, env=None, ask=lambda d: None, **kw):
    return this_node(root=root, env=env or {}, master_addr=MASTER, host_ip=None,
                     route=lambda m: route_to(m, ip=_ip(host)), ask=ask, **kw)


def test_two_fake_hosts_make_a_table_check_accepts(tmp_path):
    nodes = [_node(_tree(tmp_path / f"h{h}", h), h) for h in (0, 1)]
    table = build(nodes)
    assert check(table) == []
    assert [s["server_id"] for s in table["server_list"]] == ["10.20.0.11", "10.20.0.12"]  # eth1, never docker0/lo
    assert table["server_list"][1]["device"][7] == {"device_id": "7", "device_ip": "192.168.107.12", "rank_id": "15"}
    assert table["version"] == "1.0" and table["server_count"] == "2"


def test_the_write_and_merge_commands_on_two_trees(tmp_path):
    parts = []
    for h in (0, 1):
        out = tmp_path / f"node{h}.json"
        root = _tree(tmp_path / f"h{h}", h)
        res = CliRunner().invoke(app, ["ranktable", "write", "-o", str(out), "--root", str(root),
                                       "--host-ip", HOSTS[h]["eth1"]], env={"PATH": "/nonexistent"})
        assert res.exit_code == 0, res.output
        parts.append(str(out))
    res = CliRunner().invoke(app, ["ranktable", "merge", *parts, "-o", str(tmp_path / "table.json")])
    assert res.exit_code == 0 and "2 servers, 16 ranks" in res.output, res.output
    merged = load(tmp_path / "table.json")
    assert [d["rank_id"] for s in merged["server_list"] for d in s["device"]] == [str(r) for r in range(16)]
    res = CliRunner().invoke(app, ["ranktable", "check", str(tmp_path / "table.json")])
    assert res.exit_code == 0, res.output


@pytest.mark.subprocess
def test_a_loopback_master_is_refused_with_the_fix(tmp_path):
    res = CliRunner().invoke(app, ["ranktable", "write", "-o", str(tmp_path / "t.json"), "--root",
                                   str(_tree(tmp_path / "h", 0)), "--master-addr", "127.0.0.1"])
    assert res.exit_code == 2 and not (tmp_path / "t.json").exists()
    assert "loopback address other hosts cannot reach" in " ".join(res.output.split())


@pytest.mark.subprocess
def test_device_ips_come_from_hccn_tool_before_hccn_conf(tmp_path, monkeypatch):
    # The fake hccn_tool prints each device's own `-ip -g` answer: three recorded outputs and five written ones.
    answers = tmp_path / "answers"
    answers.mkdir()
    recorded = ["hccn_tool-ip-mindcluster-1.txt", "hccn_tool-ip-mindcluster-2.txt", "hccn_tool-ip-arthurchiao-1.txt"]
    for d, name in enumerate(recorded):
        (answers / f"hccn_tool-ip-dev{d}.txt").write_text((FAKES / "ascend-tools" / name).read_text())
    for d in range(3, 8):
        (answers / f"hccn_tool-ip-dev{d}.txt").write_text(f"ipaddr:29.1.{d}.12\nnetmask:255.255.0.0\n")
    monkeypatch.setenv("PATH", fakes_path())
    monkeypatch.setenv("NPUDIST_FAKE_HCCN_DIR", str(answers))
    node = _node(_tree(tmp_path / "h1", 1), 1, ask=ask_hccn(str(FAKES / "bin" / "hccn_tool")))
    assert [d.device_ip for d in node.devices[:3]] == ["192.161.200.10", "192.1.45.172", "29.1.112.213"]
    assert node.devices[7].device_ip == "29.1.7.12"


def test_a_device_without_a_nic_address_is_named(tmp_path):
    root = _tree(tmp_path / "h", 1)
    conf = root / "etc" / "hccn.conf"
    kept = [x for x in conf.read_text().splitlines() if not x.startswith(("address_3=", "address_6="))]
    conf.write_text("\n".join(kept))
    with pytest.raises(RankTableError, match=r"device\(s\) 3,6 have no NIC address.*hccn_tool -i N -ip -s"):
        _node(root, 1)


def test_visible_devices_map_logical_to_physical_in_a_container(tmp_path):
    # A container holding physical devices 4-7: logical 1,2 are physical 5,6 (aclrtGetPhyDevIdByLogicDevId).
    node = _node(_tree(tmp_path / "h", 1, devices=range(4, 8)), 1, env={"ASCEND_RT_VISIBLE_DEVICES": "1,2"})
    assert [(d.device_id, d.device_ip) for d in node.devices] == [(5, "192.168.105.12"), (6, "192.168.106.12")]


@pytest.mark.parametrize(("raw", "words"), [
    ("2,1", "must be ascending"), ("0, 1", "without spaces"), ("0,4", "logical ID 4 is out of range"),
])
def test_visible_devices_the_runtime_would_misread_are_refused(raw, words):
    with pytest.raises(RankTableError, match=words):
        visible_physical(raw, [4, 5, 6, 7])


def test_hccn_conf_parses_addresses_only():
    text = "address_0=192.168.100.11\nnetmask_0=255.255.255.0\nnetdetect_0=192.168.100.1\n address_12 = 10.0.0.3\n"
    assert parse_hccn_conf(text) == {0: "192.168.100.11", 12: "10.0.0.3"}


def test_superpod_nodes_write_version_1_2(tmp_path):
    nodes = [_node(_tree(tmp_path / f"h{h}", h), h, super_pod_id="7",
                   super_device_ids=[str(h * 8 + d) for d in range(8)]) for h in (0, 1)]
    table = build(nodes)
    assert check(table) == [] and table["version"] == "1.2"
    assert table["super_pod_list"] == [{"super_pod_id": "7", "server_list": [{"server_id": "10.20.0.11"},
                                                                             {"server_id": "10.20.0.12"}]}]
    assert json.dumps(table["server_list"][1]["host_ip"]) == '"10.20.0.12"'
