"""NpuSmiSource runs the fake `npu-smi` (tests/fakes/bin) and turns each failure into a SourceError reason."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from npudist.telemetry import Source, SourceError
from npudist.telemetry.sources.npu_smi import NpuSmiSource

pytestmark = pytest.mark.subprocess

FAKES = Path(__file__).resolve().parents[1] / "fakes"
MIB = 1048576


def test_reads_devices_and_processes_from_path(fake_path, monkeypatch):
    duo = FAKES / "npu-smi" / "310p3-duo-24.1.0.1-processes.txt"
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_FILE", str(duo))
    src = NpuSmiSource()
    assert isinstance(src, Source) and (src.name, src.vendor) == ("npu-smi", "npu")
    readings = src.read()
    assert [(r.device_id, r.chip_id) for r in readings] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert readings[0].memory_used_bytes == 16302 * MIB
    assert [p.pid for p in src.processes()] == [3277562, 3277565, 3034986, 3034989]
    assert fake_path.read_text().splitlines() == ["info", "info -m", "info"]  # `info -m` once, for logical ids


def test_logical_ids_and_queries(fake_path, monkeypatch, tmp_path):
    only_910b = tmp_path / "t"
    only_910b.mkdir()
    (only_910b / "t-power-910b.txt").write_text((FAKES / "npu-smi" / "t-power-910b.txt").read_text())
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_T_DIR", str(only_910b))
    src = NpuSmiSource()
    assert src.logical_ids() == {(3, 0): 0, (4, 0): 1}
    (power,) = src.query("power", 0, 0)
    assert power.power_watts == 103.5
    assert fake_path.read_text().splitlines() == ["info -m", "info -t power -i 0 -c 0"]
    with pytest.raises(ValueError, match="unknown npu-smi query 'fan'"):
        src.query("fan", 0)


def test_hang_is_killed_at_the_timeout(fake_path, monkeypatch):
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_MODE", "hang")
    start = time.monotonic()
    with pytest.raises(SourceError) as err:
        NpuSmiSource(timeout=0.5).read()
    assert err.value.reason == "timeout" and "0.5 s" in str(err.value)
    assert time.monotonic() - start < 10


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_hung_wrapper_script_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    wrapper = tmp_path / "npu-smi"  # as vendor installs ship it: a shell script around the real binary
    wrapper.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pid_file}\nwait\n")
    wrapper.chmod(0o755)
    with pytest.raises(SourceError) as err:
        NpuSmiSource(binary=str(wrapper), timeout=1.0).read()
    assert err.value.reason == "timeout" and "with its children" in str(err.value)
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), f"the wrapper's child {child} outlived the timeout (orphaned)"


def test_exit_code(fake_path, monkeypatch):
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_MODE", "fail")
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_EXIT", "3")
    with pytest.raises(SourceError) as err:
        NpuSmiSource().read()
    assert err.value.reason == "exit_code"
    assert "exited with 3" in str(err.value) and "dcmi" in str(err.value)


def test_garbage_is_a_parse_error(fake_path, monkeypatch):
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_MODE", "garbage")
    with pytest.raises(SourceError) as err:
        NpuSmiSource().read()
    assert err.value.reason == "parse"
    with pytest.raises(SourceError) as err:
        NpuSmiSource().logical_ids()
    assert err.value.reason == "parse"


def test_missing_binary(tmp_path):
    with pytest.raises(SourceError) as err:
        NpuSmiSource(binary=str(tmp_path / "npu-smi")).read()
    assert err.value.reason == "missing" and "npu-smi" in str(err.value)
