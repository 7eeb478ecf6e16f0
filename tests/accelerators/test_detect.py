"""Detection, forcing and the vendor table, in-process for the CPU and in subprocesses for fakes."""

import json

import pytest
import torch

from npudist import accelerators
from npudist.accelerators import AcceleratorUnavailable
from npudist.accelerators import rknpu as rk
from npudist.runtime import state as runtime_state
from tests.conftest import FAKES, child_env, run_py


def _close_runtime() -> None:
    """Settings are read and detection cached per Runtime: the next call starts a fresh one."""
    rt = runtime_state.peek()
    if rt is not None:
        rt.close()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("NPUDIST_ACCELERATOR", raising=False)
    monkeypatch.delenv("NPUDIST_SYSFS_ROOT", raising=False)
    _close_runtime()
    yield
    _close_runtime()


def test_cpu_is_detected_when_nothing_else_exists():
    acc = accelerators.accelerator()
    assert acc.name == "cpu" and acc.backend == "gloo" and acc.device(0) == torch.device("cpu")
    assert acc.memory_stats() == {}
    assert accelerators.accelerator() is acc  # cached


def test_detection_order_is_the_documented_one():
    assert [v.name for v in accelerators.VENDORS] == ["npu", "cuda", "mlu", "rknpu", "cpu"]


def test_every_row_names_backend_and_visible_devices():
    rows = accelerators.BY_NAME
    assert (rows["npu"].backend, rows["npu"].visible_devices_var, rows["npu"].module) == (
        "hccl", "ASCEND_RT_VISIBLE_DEVICES", "torch_npu")
    assert (rows["mlu"].backend, rows["mlu"].visible_devices_var) == ("cncl", "MLU_VISIBLE_DEVICES")
    assert (rows["cuda"].backend, rows["cuda"].visible_devices_var) == ("nccl", "CUDA_VISIBLE_DEVICES")
    assert rows["rknpu"].stage_through_cpu and not rows["cpu"].stage_through_cpu


def test_forcing_a_missing_vendor_says_why(monkeypatch):
    monkeypatch.setenv("NPUDIST_ACCELERATOR", "npu")
    with pytest.raises(AcceleratorUnavailable, match="'torch_npu' is not installed"):
        accelerators.accelerator()


def test_forcing_an_unknown_name_lists_the_choices(monkeypatch):
    monkeypatch.setenv("NPUDIST_ACCELERATOR", "tpu")
    with pytest.raises(AcceleratorUnavailable, match="choose one of npu, cuda, mlu, rknpu, cpu"):
        accelerators.accelerator()


def test_rknpu_found_by_devfreq_node_in_a_fake_sysfs(tmp_path, monkeypatch):
    assert rk.probe(str(tmp_path)) is not None
    (tmp_path / "sys/class/devfreq/fdab0000.npu").mkdir(parents=True)
    assert rk.probe(str(tmp_path)) is None
    monkeypatch.setenv("NPUDIST_SYSFS_ROOT", str(tmp_path))
    acc = accelerators.accelerator()  # rknpu comes before cpu in the detection order
    assert acc.name == "rknpu" and acc.stage_through_cpu and acc.backend == "gloo"
    assert acc.device(0) == torch.device("cpu")


def test_rknpu_forced_without_a_board_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUDIST_SYSFS_ROOT", str(tmp_path))
    monkeypatch.setenv("NPUDIST_ACCELERATOR", "rknpu")
    with pytest.raises(AcceleratorUnavailable, match="no Rockchip NPU driver"):
        accelerators.accelerator()


_PROBE = """
import json, npudist, torch
acc = npudist.accelerator()
out = {"name": acc.name, "backend": acc.backend, "count": acc.device_count(), "dev3": str(acc.device(3)),
       "mem": acc.memory_stats()}
acc.set_device(2)
out["current"] = str(acc.device())
ctx = npudist.init()
import torch_npu
out["ctx_device"] = str(ctx.device)
out["ctx_backend"] = ctx.backend
out["events"] = torch_npu.EVENTS
print(json.dumps(out))
"""


@pytest.mark.subprocess
def test_fake_torch_npu_is_detected_first_and_device_set_before_group():
    done = run_py(["-c", _PROBE], env=child_env(pythonpath=[FAKES / "vendors"]))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["name"] == "npu"
    assert out["backend"] == "hccl"  # taken from torch's device->backend map, registered by the fake
    assert out["count"] == 8 and out["dev3"] == "npu:3" and out["current"] == "npu:2"
    assert out["mem"] == {"allocated_bytes": 3 * 1024 * 1024, "reserved_bytes": 4 * 1024 * 1024}
    assert out["ctx_device"] == "npu:0" and out["ctx_backend"] == "hccl"
    events = [tuple(e) for e in out["events"]]
    # init() selected device 0 before the HCCL group existed, and the group saw device 0 as current.
    assert events.index(("set_device", 0)) < events.index(("hccl_group_created", 0))


@pytest.mark.subprocess
def test_fake_npu_unavailable_falls_back_to_cpu():
    env = child_env({"FAKE_NPU_UNAVAILABLE": "1"}, pythonpath=[FAKES / "vendors"])
    done = run_py(["-c", "import npudist; print(npudist.accelerator().name); "
                         "print(npudist.accelerators.why_unavailable(npudist.accelerators.BY_NAME['npu']))"], env=env)
    assert done.returncode == 0, done.stderr
    name, reason = done.stdout.strip().splitlines()[-2:]
    assert name == "cpu" and "is_available() is False" in reason


@pytest.mark.subprocess
def test_broken_torch_npu_never_breaks_import_and_forcing_reports_the_import_error():
    env = child_env(pythonpath=[FAKES / "vendors_broken"])
    done = run_py(["-c", "import npudist; print(npudist.accelerator().name)"], env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "cpu"
    forced = run_py(["-c", "import npudist; npudist.accelerator()"], env={**env, "NPUDIST_ACCELERATOR": "npu"})
    assert forced.returncode != 0
    assert "libhccl.so: cannot open shared object file" in forced.stderr
    assert "AcceleratorUnavailable" in forced.stderr
