"""The simulated NPU has torch_npu's shape: it arrives with ``import torch`` in a simulating process only, and
Huawei's quick start, its transfer_to_npu port and torch_npu's own test style run unchanged on it."""

from __future__ import annotations

import json
import warnings
from importlib.metadata import entry_points

import pytest
import torch

from npudist.runtime import compat
from npudist.sim import autoload
from npudist.sim.state import SIM
from npudist.sim.transfer import to_npu
from tests.conftest import child_env, free_port, run_npudist, run_py
from tests.sim import chips

needs_sim = pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")
# torch/__init__.py calls the torch.backends entry points from torch 2.5 (_import_device_backends)
needs_autoload = pytest.mark.skipif(not hasattr(torch, "_import_device_backends"),
                                    reason="entry points of torch.backends are loaded by torch >= 2.5")


def _results(text: str) -> dict[int, dict]:
    found = [json.loads(line.split(" ", 1)[1]) for line in text.splitlines() if line.startswith("RESULT ")]
    return {r.get("rank", 0): r for r in found}


def test_the_entry_point_is_registered_in_torch_backends():
    # What torch/__init__.py _import_device_backends iterates at import torch (torch >= 2.5).
    assert "npudist.sim.autoload:autoload" in [e.value for e in entry_points(group="torch.backends")], \
        "npudist's metadata lacks its torch.backends entry point: re-install it (pip install -e .)"


@pytest.mark.subprocess
def test_import_torch_without_simulate_loads_nothing():
    proc = run_py(["-c", "import sys, torch; print(hasattr(torch, 'npu'), 'torch_npu' in sys.modules, "
                         "'npudist.sim.state' in sys.modules, torch._C._get_privateuse1_backend_name())"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", "False", "privateuseone"]


@pytest.mark.subprocess
@needs_autoload
def test_a_bad_simulate_value_leaves_import_torch_working_and_says_why():
    proc = run_py(["-c", "import torch; print(hasattr(torch, 'npu'))"], env=child_env({"NPUDIST_SIMULATE": "gpu"}))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]
    assert "did not load at import torch: SettingsError: NPUDIST_SIMULATE='gpu'" in proc.stderr


def test_the_entry_point_never_raises(monkeypatch):
    def broken() -> None:
        raise ImportError("libsim.so: cannot open shared object file")

    monkeypatch.setenv("NPUDIST_SIMULATE", "npu")
    monkeypatch.setattr(autoload, "_load", broken)
    monkeypatch.setattr(SIM, "autoload_failure", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        autoload.autoload()
    assert SIM.autoload_failure == "ImportError: libsim.so: cannot open shared object file"
    assert any("did not load at import torch" in str(w.message) for w in caught)


def test_the_entry_point_is_silent_when_not_simulating(monkeypatch):
    monkeypatch.delenv("NPUDIST_SIMULATE", raising=False)
    monkeypatch.setattr(autoload, "_load", lambda: pytest.fail("loaded without NPUDIST_SIMULATE"))
    autoload.autoload()


@pytest.mark.parametrize(("given", "index_is_device", "expected"), [
    ("cuda", False, "npu"), ("cuda:1", False, "npu:1"), (3, True, "npu:3"), (3, False, 3), (True, True, True),
    ({"cuda:0": "cuda:1"}, False, {"npu:0": "npu:1"}), ("cpu", True, "cpu"),
    (torch.device("cpu"), False, torch.device("cpu")),
])
def test_transfer_maps_cuda_devices_as_huaweis_does(given, index_is_device, expected):
    # Ascend/pytorch torch_npu/contrib/transfer_to_npu.py: _replace_cuda_to_npu_in_list / _in_kwargs / _in_dict.
    # (torch.device("cuda", 1) needs the npu device type: shape_probe.py checks it in a simulating process.)
    assert to_npu(given, index_is_device=index_is_device) == expected


@pytest.fixture(scope="module")
def shape() -> dict:
    if not compat.simulation_available():
        pytest.skip("the simulated NPU needs torch >= 2.10")
    proc = run_py(["tests/sim/shape_probe.py"], env=child_env({"NPUDIST_SIMULATE": "npu"}), timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return _results(proc.stdout)[0]


@pytest.mark.subprocess
def test_import_torch_alone_brings_the_npu_in_a_simulating_process(shape):
    assert shape["torch_npu_loaded_by_import_torch"]
    assert shape["device_string"] == "npu:0"
    assert shape["accelerator"] == ["npu", True]
    assert shape["same_module"] == [True, True, True, True]
    assert shape["cuda_device_mapped"] == ["npu:1", "npu"]


@pytest.mark.subprocess
def test_names_not_simulated_say_so(shape):
    assert shape["not_simulated_attr"].startswith("NotSimulated: not simulated: torch_npu.npu_rms_norm")
    assert shape["not_simulated_npu_attr"].startswith("NotSimulated: not simulated: torch.npu.NPUGraph")
    assert shape["not_simulated_module"].startswith("ModuleNotFoundError: not simulated: torch_npu.profiler")
    assert shape["hasattr_is_false"] == [False, False]  # torch's own probes (hasattr) still work
    # a name torch_npu does not have either is the ordinary error, as on torch_npu
    assert shape["not_torch_npus"] == "AttributeError: module 'torch.npu' has no attribute 'no_such_call'"
    assert shape["simulated_extras"] == [False, True, 1]


@pytest.mark.subprocess
def test_streams_events_and_memory_behave(shape):
    assert 15.0 <= shape["event_ms"] < 2000.0  # the host time between the two records around a 20 ms sleep
    assert shape["stream_query"] == [True, True]
    total, used, held = shape["mem"]
    assert used == held and total == shape["props"][1]
    assert shape["props"][0].startswith("simulated Ascend NPU")


@pytest.mark.subprocess
def test_torch_npu_amp_and_torch_amp_on_npu(shape):
    assert shape["npu_amp_dtype"] == "torch.float16"  # torch_npu's autocast defaults to float16
    assert shape["torch_amp_dtype"] == "torch.bfloat16"
    assert shape["static_scale"] == 1024.0  # dynamic=False: the scale stays although every step overflowed
    assert shape["dynamic_scale"] == 512.0  # torch's scaler on npu backs off after an overflow


@pytest.mark.ranks
@pytest.mark.slow
@needs_sim
def test_huaweis_quick_start_trains_unchanged():
    proc = run_npudist(["launch", "--simulate", "npu", "--nproc-per-node", "1", "tests/sim/huawei_quick_start.py"],
                       timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = _results(proc.stdout)[0]
    assert r["device"] == "npu:0" and r["autocast_dtypes"] == ["torch.float16"]
    assert r["last"] < 0.6 * r["first"] and r["accuracy"] > 0.5
    assert r["cuda_available"] and r["cuda_device_name"].startswith("simulated Ascend NPU")
    assert r["torch_npu"].endswith("+npudist.sim")


@pytest.mark.ranks
@pytest.mark.slow
@needs_sim
def test_a_cuda_ddp_script_ported_with_transfer_to_npu_trains_unchanged_on_two_ranks():
    proc = run_npudist(["launch", "--simulate", "npu", "--nproc-per-node", "2", "tests/sim/transfer_to_npu_ddp.py"],
                       timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = _results(proc.stdout)
    assert sorted(ranks) == [0, 1]
    for rank, r in ranks.items():
        # nccl and "cuda" mapped; the device is the rank's own chip (tests/sim/chips.py)
        assert (r["backend"], r["device"], r["on"]) == ("hccl", chips.device(rank), chips.device(rank))
        assert r["is_cuda"]  # Tensor.is_cuda is Tensor.is_npu after the port, as on Ascend
        assert r["all_reduce"] == [3.0] * 4
        assert r["autocast_dtypes"] == ["torch.float16"]  # torch.cuda.amp became torch_npu's amp
        assert r["device_name"] == f"simulated Ascend NPU (chip {rank})"
        assert r["jit_scripted"] is False  # transfer_to_npu switches torch.jit.script off
        # a torch_npu function not simulated, reached through torch.cuda as transfer_to_npu maps it
        assert r["cuda_graph"].startswith("NotSimulated: not simulated: torch.npu.graph_pool_handle (torch.cuda.")
        assert r["last"] < r["first"]
    assert ranks[0]["params_head"] == ranks[1]["params_head"]  # DDP kept the replicas equal


@pytest.mark.ranks
@pytest.mark.slow
@needs_sim
def test_a_torch_npu_test_style_script_runs_through_the_entry_point_alone():
    """Under plain torchrun with NPUDIST_SIMULATE: no stand-in on PYTHONPATH, no import torch_npu."""
    env = child_env({"NPUDIST_SIMULATE": "npu"})
    proc = run_py(["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
                   "tests/sim/npu_test_style.py"], env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = _results(proc.stdout)
    assert sorted(ranks) == [0, 1]
    for rank, r in ranks.items():
        assert r["all_reduce"] == 2 and r["device"] == chips.device(rank) and r["current_device"] == rank
        assert r["avg"] == [1.5] * 8 and r["avg_dtype"] == "torch.bfloat16"  # AVG on the default hccl row
        assert (r["accelerator"], r["accelerator_count"], r["npu_count"]) == ("npu", 8, 8)  # the host's chips
        assert r["torch_npu_loaded"]
        assert r["last"] < 0.01 * r["first"]
