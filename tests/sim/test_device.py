"""The simulated device: placement, aliasing, bitwise-equal training, memory counts, one device per process."""

from __future__ import annotations

import json

import pytest

from npudist.runtime import compat
from npudist.sim import SimulationError, parse_mode
from npudist.sim.device import SimDeviceError, physical_chip
from tests.conftest import run_py
from tests.sim import chips


@pytest.fixture(scope="module")
def probe() -> dict:
    if not compat.simulation_available():
        pytest.skip("the simulated NPU needs torch >= 2.10")
    proc = run_py(["tests/sim/device_probe.py"], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.split(" ", 1)[1])


@pytest.mark.subprocess
def test_tensors_live_on_npu_and_views_alias(probe):
    assert probe["alias"] == [0.0, 1.0, 1.0, 0.0]
    assert probe["devices"] == ["npu:0"] * 4
    assert probe["to_cpu_is_plain"]
    assert probe["transpose_contiguous"] == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


@pytest.mark.subprocess
def test_arange_on_the_device_has_the_shape_of_its_values(probe):
    assert probe["aranges"] == [[[6], "torch.float32", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]],
                                [[3], "torch.int64", [2, 3, 4]],
                                [[3], "torch.float64", [0.0, 0.5, 1.0]]]
    # an out= tensor the op resizes: the wrapper follows the host tensor (all_gather_object resizes one too)
    assert probe["arange_resized_out"] == [[3], [0.0, 1.0, 2.0]]


@pytest.mark.subprocess
def test_training_on_the_simulated_npu_is_bitwise_the_cpu(probe):
    assert probe["bitwise_equal_training"]


@pytest.mark.subprocess
def test_memory_counts_real_bytes_once_per_storage(probe):
    assert probe["allocated_delta"] == 1024 * 4
    assert probe["freed_delta"] == 0
    assert probe["reserved_at_least_allocated"]
    stats = probe["stats"]
    assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"] >= 1024 * 4
    assert (stats["num_alloc_retries"], stats["num_ooms"]) == (0, 0)
    assert probe["stats_peaks_cover_current"]


@pytest.mark.subprocess
def test_streams_carry_the_fields_fsdp2_records(probe):
    assert probe["stream_fields"] == [0, True, True]
    # where torch has the op (2.15), the probe called it with a simulated stream; it would have raised without them
    assert probe["fsdp_records_the_stream"] in ("ran", "absent")


@pytest.mark.subprocess
def test_a_process_sees_every_chip_of_the_host(probe):
    assert probe["device_count"] == 8  # no ASCEND_RT_VISIBLE_DEVICES: the 8 chips of the simulated host
    assert probe["set_device_1"] is None
    assert probe["set_device_8"].startswith("Invalid device ID 8")
    # npu:3 is chip 3 of the host; without the C++ guard every index stands for the process's one chip (0 here)
    assert probe["device_name_3"] == f"simulated Ascend NPU (chip {3 if chips.separate() else 0})"
    assert probe["event_ms_nonnegative"]


@pytest.mark.subprocess
def test_saved_tensors_are_host_tensors(probe):
    assert probe["saved_as"] == ["cpu", [0.0, 1.0, 2.0]]


@pytest.mark.subprocess
def test_op_sampling_counts_a_subclass_op_once(probe):
    assert probe["profiled_matmuls"] == 1
    assert probe["row"] == "hccl"


@pytest.mark.parametrize(("env", "chip"), [
    ({"LOCAL_RANK": "3"}, 3),                                           # unset: the local rank's chip
    ({"LOCAL_RANK": "1", "ASCEND_RT_VISIBLE_DEVICES": "6"}, 6),         # one chip per rank, named
    ({"LOCAL_RANK": "1", "ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"}, 5),   # node-wide list: entry at local rank
])
def test_local_rank_to_physical_chip(env, chip):
    assert physical_chip(env, chips=8) == chip


@pytest.mark.parametrize("env", [{"LOCAL_RANK": "8"}, {"LOCAL_RANK": "2", "ASCEND_RT_VISIBLE_DEVICES": "0,1"},
                                 {"ASCEND_RT_VISIBLE_DEVICES": "x"}])
def test_chips_the_host_lacks_are_errors(env):
    with pytest.raises(SimDeviceError):
        physical_chip(env, chips=8)


def test_modes_are_checked():
    assert parse_mode(" NPU:Strict ") == "npu:strict"
    with pytest.raises(SimulationError, match="choose one of npu, npu:strict"):
        parse_mode("cuda")
