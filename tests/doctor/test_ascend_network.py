"""The doctor's Ascend NIC checks against the fake npu-smi and hccn_tool: a down NIC is named, and the NICs'
addresses must follow one subnet plan (fake `-ip -g` answers written per device into a folder)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npudist.doctor import FAIL, OK, SKIP, WARN, Host
from npudist.doctor.ascend_network import ascend_nics
from tests.conftest import FAKES, fakes_path


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return {"PATH": fakes_path(),
            "NPUDIST_FAKE_HCCN_DIR": str(tmp_path / "answers")}


def _run(env: dict[str, str], **extra: str) -> dict[str, object]:
    old = dict(os.environ)
    os.environ.update({**env, **extra})  # the fakes read their variables from the environment
    try:
        return {r.name: r for r in ascend_nics(Host(env={**env, **extra}, tool_timeout=20))}
    finally:
        os.environ.clear()
        os.environ.update(old)


def _ips(folder: Path, plan: dict[int, tuple[str, str]]) -> None:
    folder.mkdir(exist_ok=True)
    for nic, (address, mask) in plan.items():
        (folder / f"hccn_tool-ip-dev{nic}.txt").write_text(f"ipaddr:{address}\nnetmask:{mask}\n")


@pytest.mark.subprocess
def test_healthy_nics_in_one_subnet_per_nic(env, tmp_path):
    # info-m-mapping.txt: NPU 3 chip 0 is logical (NIC) 0, NPU 4 chip 0 is NIC 1
    _ips(tmp_path / "answers", {0: ("192.168.100.101", "255.255.255.0"), 1: ("192.168.101.101", "255.255.255.0")})
    got = _run(env)
    assert got["ascend-nics"].status == OK
    assert got["ascend-nic-ips"].status == OK and "one subnet per NIC" in got["ascend-nic-ips"].finding


@pytest.mark.subprocess
def test_a_down_nic_is_named(env, tmp_path):
    _ips(tmp_path / "answers", {0: ("10.0.0.10", "255.255.255.0"), 1: ("10.0.0.11", "255.255.255.0")})
    got = _run(env, NPUDIST_FAKE_HCCN_DOWN="1")
    nics = got["ascend-nics"]
    assert nics.status == FAIL
    assert nics.finding == "NIC 1 (NPU 4 chip 0, 10.0.0.11): link DOWN"
    assert "hccn_tool -i N -optical -g" in nics.fix


@pytest.mark.subprocess
def test_unhealthy_net_health_is_named(env, tmp_path):
    answers = tmp_path / "answers"
    _ips(answers, {0: ("10.0.0.10", "255.255.255.0"), 1: ("10.0.0.11", "255.255.255.0")})
    (answers / "hccn_tool-net_health-dev0.txt").write_text(
        (FAKES / "ascend-tools" / "hccn_tool-net_health-mindcluster-1.txt").read_text())
    assert _run(env)["ascend-nics"].finding == "NIC 0 (NPU 3 chip 0, 10.0.0.10): net health socket_fail"


@pytest.mark.subprocess
@pytest.mark.parametrize("plan, named", [
    ({0: ("10.0.0.10", "255.255.255.0"), 1: ("10.0.0.11", "255.255.0.0")}, "netmask 255.255.0.0"),
    ({0: ("10.0.0.10", "255.255.255.0"), 1: ("10.0.0.10", "255.255.255.0")}, "shares its address"),
])
def test_addresses_outside_the_plan_fail(env, tmp_path, plan, named):
    _ips(tmp_path / "answers", plan)
    ips = _run(env)["ascend-nic-ips"]
    assert ips.status == FAIL and named in ips.finding


def test_a_mixed_plan_names_the_odd_nic():
    import ipaddress

    from npudist.doctor.ascend_network import _subnet_plan

    shared = {n: (ipaddress.IPv4Interface(f"10.0.0.{n + 10}/24"), f"NIC {n}") for n in range(7)}
    shared[7] = (ipaddress.IPv4Interface("10.0.9.17/24"), "NIC 7")
    got = _subnet_plan(shared, [])
    assert got.status == FAIL and got.finding == "NIC 7 is in 10.0.9.0/24, while its peers share 10.0.0.0/24"
    per_nic = {n: (ipaddress.IPv4Interface(f"10.0.{n}.10/24"), f"NIC {n}") for n in range(8)}
    per_nic[7] = (ipaddress.IPv4Interface("10.0.6.11/24"), "NIC 7")
    got = _subnet_plan(per_nic, [])
    assert got.status == FAIL and "NIC 6 shares subnet 10.0.6.0/24" in got.finding and "NIC 7" in got.finding
    assert _subnet_plan({}, ["NIC 0 (NPU 0 chip 0): `hccn_tool -i 0 -ip -g` unusable"]).status == FAIL


@pytest.mark.subprocess
def test_failing_tool_is_a_finding_and_no_tool_skips(env):
    got = _run(env, NPUDIST_FAKE_HCCN_MODE="fail")
    assert got["ascend-nics"].status == FAIL and "`hccn_tool -i 0 -link -g` unusable" in got["ascend-nics"].finding
    assert got["ascend-nic-ips"].status == FAIL
    assert _run(env, NPUDIST_FAKE_NPU_SMI_MODE="garbage")["ascend-nics"].status == WARN
    (skipped,) = ascend_nics(Host(env={"PATH": ""}, root=Path("/nonexistent")))
    assert skipped.status == SKIP
