"""The doctor's Ascend device checks on fabricated hosts: /dev and /proc trees under a temporary root, the fake
npu-smi's recorded process table, and a port probe that says which ports are taken."""

from __future__ import annotations

import os

import pytest

from npudist.doctor import FAIL, OK, SKIP, WARN, Host
from npudist.doctor import ascend_host as ah
from npudist.doctor.ascend import version_triad
from tests.conftest import child_env, fakes_path


def _root(tmp_path, chips=range(8), extras=("davinci_manager", "devmm_svm", "hisi_hdc"), lib=True, pids=()):
    (tmp_path / "dev").mkdir(parents=True, exist_ok=True)
    for name in [f"davinci{c}" for c in chips] + list(extras):
        (tmp_path / "dev" / name).touch()
    if lib:
        lib64 = tmp_path / "usr/local/Ascend/driver/lib64"
        lib64.mkdir(parents=True)
        (lib64 / "libascend_hal.so").touch()
    for pid in pids:
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    return tmp_path


def _host(root, **env) -> Host:
    return Host(env={"PATH": "", **env}, root=root, port_free=lambda p: True)


# --- ASCEND_RT_VISIBLE_DEVICES ---------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "status", "words"), [
    (None, OK, "unset: all 8 device(s) visible"),
    ("0,1,2,3", OK, "physical device(s) 0,1,2,3 of 8"),
    ("3,1", FAIL, "must be ascending"),
    ("0, 1", FAIL, "without spaces"),
    ("0,8", FAIL, "logical ID 8 is out of range, 8 device(s) are present"),
])
def test_visible_devices_ascending_and_in_range(tmp_path, value, status, words):
    env = {} if value is None else {"ASCEND_RT_VISIBLE_DEVICES": value}
    got = ah.visible_devices(_host(_root(tmp_path), **env))
    assert got.status == status and words in got.finding, got
    assert got.status == OK or "ascending" in got.fix


def test_visible_devices_in_a_container_name_the_physical_ids(tmp_path):
    got = ah.visible_devices(_host(_root(tmp_path, chips=(4, 5, 6, 7)), ASCEND_RT_VISIBLE_DEVICES="1,2"))
    assert got.status == OK and "physical device(s) 5,6 of 4" in got.finding


@pytest.mark.subprocess
def test_visible_devices_count_chips_from_npu_smi_without_dev_files(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fakes_path())  # info-m-mapping.txt: two chips with logical IDs 0 and 1
    got = ah.visible_devices(Host(env={"PATH": fakes_path(), "ASCEND_RT_VISIBLE_DEVICES": "2"}, root=tmp_path))
    assert got.status == FAIL and "2 device(s) are present" in got.finding


# --- ASCEND_RT_VISIBLE_DEVICES against torch.npu.device_count() (a probe injected; npu_probe.py's own below) ---

def _counted(root, count, **env) -> Host:
    """A host whose torch.npu.device_count() answers ``count`` (an exception: raised) under its environment."""
    def probe(seen_env):
        assert seen_env.get("ASCEND_RT_VISIBLE_DEVICES") == env.get("ASCEND_RT_VISIBLE_DEVICES")  # asked under it
        if isinstance(count, Exception):
            raise count
        return count

    return Host(env={"PATH": "", **env}, root=root, port_free=lambda p: True, npu_count=probe)


@pytest.mark.parametrize(("value", "count", "status", "words", "fix"), [
    # A list the runtime cannot read: it drops devices without an error, the count shows it.
    ("3,1", 0, FAIL, "must be ascending and distinct (the runtime supports only ascending order); write 1,3; "
     "torch.npu.device_count() is 0 under it", "ascending"),
    ("0,1,2,3", 4, OK, "physical device(s) 0,1,2,3 of 8; torch.npu.device_count() agrees (4)", ""),
    (None, 8, OK, "all 8 device(s) visible (physical 0,1,2,3,4,5,6,7); torch.npu.device_count() agrees (8)", ""),
    # A valid list, yet the runtime opens fewer (a device held or not mounted, or a list set too late).
    ("0,1,2,3", 2, FAIL, "physical device(s) 0,1,2,3 of 8, but torch.npu.device_count() is 2, not 4", "mounted"),
])
def test_visible_devices_against_what_torch_npu_counts(tmp_path, value, count, status, words, fix):
    env = {} if value is None else {"ASCEND_RT_VISIBLE_DEVICES": value}
    got = ah.visible_devices(_counted(_root(tmp_path), count, **env))
    assert got.status == status and words in got.finding, got
    assert fix in got.fix


def test_a_probe_that_hangs_is_a_warning_that_keeps_the_tree_check(tmp_path):
    from npudist.doctor.npu_probe import ProbeError

    hung = ProbeError("torch.npu.device_count() did not answer in 60 s (the runtime hangs: see `npu-smi info`)")
    root = _root(tmp_path)
    got = ah.visible_devices(_counted(root, hung, ASCEND_RT_VISIBLE_DEVICES="0,1"))
    assert got.status == WARN and "physical device(s) 0,1 of 8; torch.npu.device_count() did not answer" in got.finding
    assert "by hand" in got.fix
    bad_list = ah.visible_devices(_counted(root, hung, ASCEND_RT_VISIBLE_DEVICES="1,0"))
    assert bad_list.status == FAIL and "ascending" in bad_list.fix  # the list's own fault stays the finding


@pytest.mark.parametrize(("value", "count", "status", "words"), [
    ("0,1,2", 3, OK, "torch.npu.device_count() is 3 under ASCEND_RT_VISIBLE_DEVICES=0,1,2"),
    ("0,1,2", 1, FAIL, "lists 3 device(s), but torch.npu.device_count() is 1"),
    ("2,0", 0, FAIL, "must be ascending"),
    (None, 8, OK, "torch.npu.device_count() is 8 (torch_npu; no /dev/davinciN"),
])
def test_without_a_device_tree_the_count_is_checked_against_the_list(tmp_path, value, count, status, words):
    env = {} if value is None else {"ASCEND_RT_VISIBLE_DEVICES": value}
    got = ah.visible_devices(_counted(tmp_path, count, **env))
    assert got.status == status and words in got.finding, got


def test_nothing_to_probe_and_no_tree_is_not_applicable(tmp_path):
    assert ah.visible_devices(_counted(tmp_path, None)).status == SKIP


def test_the_probe_reads_the_count_the_child_printed():
    from npudist.doctor.npu_probe import parse_count

    assert parse_count("warning: CANN 8.0\nnpudist-npu-count=4\n") == 4
    assert parse_count("Segmentation fault\n") is None
    assert parse_count("npudist-npu-count=x\n") is None


@pytest.mark.subprocess
@pytest.mark.parametrize(("code", "words"), [
    ("import time; time.sleep(30)", "did not answer in 1 s"),
    ("import sys; sys.exit('ImportError: libhccl.so: cannot open shared object file')", "libhccl.so"),
])
def test_a_child_that_hangs_or_dies_becomes_a_probe_error(monkeypatch, code, words):
    from npudist.doctor import npu_probe

    monkeypatch.setattr(npu_probe, "probe_code", lambda env: code)
    with pytest.raises(npu_probe.ProbeError, match=words):
        npu_probe.npu_count(child_env(), timeout_s=1)


@pytest.mark.subprocess
def test_the_simulated_npu_is_counted_under_the_list(tmp_path):
    # The real probe, in a child: npudist.sim's device_count() under ASCEND_RT_VISIBLE_DEVICES.
    env = child_env({"NPUDIST_SIMULATE": "npu", "ASCEND_RT_VISIBLE_DEVICES": "0,1,2", "PATH": ""})
    got = ah.visible_devices(Host(env=env, root=tmp_path))
    assert got.status == OK, got
    assert "torch.npu.device_count() is 3 under ASCEND_RT_VISIBLE_DEVICES=0,1,2 (simulated NPU" in got.finding


# --- devices held by processes --------------------------------------------------------------------------

def _holders(root, **env):
    old = dict(os.environ)
    os.environ["PATH"] = fakes_path()  # the fake npu-smi reads its variables from the environment
    os.environ.update(env)
    try:
        return ah.device_holders(Host(env={"PATH": fakes_path(), **env}, root=root, tool_timeout=20))
    finally:
        os.environ.clear()
        os.environ.update(old)


@pytest.mark.subprocess
def test_a_device_held_by_a_process_that_is_gone_is_named_with_the_reset(tmp_path):
    # 910b2c-23.0.2.1-with-processes.txt: NPU 0 chip 0 held by pid 124528 (python3.8, 17400 MB)
    got = _holders(_root(tmp_path))
    assert got.status == FAIL
    assert got.finding == ("held by processes that no longer run: NPU 0 chip 0: pid 124528 (python3.8, 17400 MiB)")
    assert got.fix.endswith("npu-smi set -t reset -i 0 -c 0")


@pytest.mark.subprocess
def test_a_running_holder_is_not_a_failure(tmp_path):
    got = _holders(_root(tmp_path, pids=[124528]))
    assert got.status == OK and "1 process(es) hold devices, all running" in got.finding


@pytest.mark.subprocess
def test_in_a_container_an_invisible_holder_only_warns(tmp_path):
    root = _root(tmp_path)
    (root / ".dockerenv").touch()
    got = _holders(root)
    assert got.status == WARN and "not visible in this container" in got.finding


@pytest.mark.subprocess
def test_no_holder_and_an_unusable_npu_smi(tmp_path):
    from tests.conftest import FAKES

    quiet = FAKES / "npu-smi" / "310-23.0.0-no-processes.txt"
    root = _root(tmp_path)
    assert _holders(root, NPUDIST_FAKE_NPU_SMI_FILE=str(quiet)).status == OK
    assert _holders(root, NPUDIST_FAKE_NPU_SMI_MODE="garbage").status == WARN


# --- container mounts -------------------------------------------------------------------------------------

def test_a_complete_device_tree_passes(tmp_path):
    got = ah.device_mounts(_host(_root(tmp_path)))
    assert got.status == OK and "8 /dev/davinciN" in got.finding


def test_a_container_missing_mounts_names_each_with_its_docker_option(tmp_path):
    root = _root(tmp_path, extras=("davinci_manager",), lib=False)
    (root / ".dockerenv").touch()
    got = ah.device_mounts(_host(root))
    assert got.status == FAIL
    assert "/dev/devmm_svm (shared virtual memory), /dev/hisi_hdc (the host-device channel), " \
           "/usr/local/Ascend/driver/lib64 (the driver's libraries)" in got.finding
    assert "--device=/dev/devmm_svm --device=/dev/hisi_hdc -v /usr/local/Ascend/driver:" in got.fix


def test_an_empty_driver_lib64_counts_as_missing(tmp_path):
    root = _root(tmp_path, lib=False)
    (root / "usr/local/Ascend/driver/lib64").mkdir(parents=True)
    got = ah.device_mounts(_host(root))
    assert got.status == FAIL and "lib64" in got.finding and "install the Ascend driver" in got.fix


def test_mounts_are_not_checked_off_ascend(tmp_path):
    assert ah.device_mounts(_host(tmp_path)).status == SKIP


# --- HCCL host ports --------------------------------------------------------------------------------------

def _sysctl(root, reserved="", ephemeral="32768\t60999"):
    d = root / "proc/sys/net/ipv4"
    d.mkdir(parents=True, exist_ok=True)
    (d / "ip_local_reserved_ports").write_text(reserved + "\n")
    (d / "ip_local_port_range").write_text(ephemeral + "\n")


def test_busy_hccl_ports_are_named(tmp_path):
    root = _root(tmp_path)
    _sysctl(root, reserved="60000-60031")
    got = ah.hccl_ports(Host(env={"PATH": ""}, root=root, port_free=lambda p: p not in (60003, 60017)))
    assert got.status == FAIL and "port(s) 60003,60017 of HCCL's 60000-60031 are in use" in got.finding


def test_unreserved_ports_in_the_ephemeral_range_warn_with_the_sysctl(tmp_path):
    root = _root(tmp_path)
    _sysctl(root)
    got = ah.hccl_ports(_host(root))
    assert got.status == WARN and got.fix.startswith("sysctl -w net.ipv4.ip_local_reserved_ports=60000-60031")
    _sysctl(root, reserved="8080,60000-60031")
    assert ah.hccl_ports(_host(root)).status == OK
    moved = ah.hccl_ports(_host(root, HCCL_IF_BASE_PORT="20000"))  # below the ephemeral range
    assert moved.status == OK and "20000-20031" in moved.finding


def test_a_bad_base_port_fails(tmp_path):
    got = ah.hccl_ports(_host(_root(tmp_path), HCCL_IF_BASE_PORT="70000"))
    assert got.status == FAIL and "[1024, 65520]" in got.finding


def test_port_ranges_parse_both_proc_formats():
    assert ah.parse_port_ranges("32768\t60999\n") == [(32768, 60999)]
    assert ah.parse_port_ranges("8080,60000-60031\n") == [(8080, 8080), (60000, 60031)]
    assert ah.parse_port_ranges("\n") == []


# --- the torch / torch_npu / CANN triad --------------------------------------------------------------------

@pytest.mark.parametrize(("torch", "npu", "cann", "status", "words"), [
    ("2.1.0+cpu", "2.1.0.post10", "8.0.0", OK, "a released combination"),
    ("2.4.0", "2.1.0.post10", "8.0.0", FAIL, "built for torch 2.1.0"),
    ("2.1.0", "2.1.0.post10", "8.0.RC2", WARN, "built for CANN 8.0.0"),
    ("2.5.1", "2.5.1", "8.1.rc1", OK, "a released combination"),
    ("2.1.0", "2.1.0.post10", "7.0.0.5.242", OK, "could not be compared"),
    ("2.1.0", "2.1.0.post99", "8.0.0", SKIP, "not in npudist's release table"),
])
def test_version_triad(torch, npu, cann, status, words):
    got = version_triad(torch, npu, cann)
    assert got.status == status and words in got.finding, got
    if status in (FAIL, WARN):
        assert "COMPATIBILITY.en.md" in got.fix
