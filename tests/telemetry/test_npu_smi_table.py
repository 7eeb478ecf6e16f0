"""`npu-smi info` table parser against real recordings; expected values typed from the recording text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npudist.telemetry import ParseError
from npudist.telemetry.sources.npu_smi import parse, parse_processes, parse_table

REC = Path(__file__).resolve().parents[1] / "fakes" / "npu-smi"
MIB = 1048576  # npu-smi "MB" are MiB


def rec(name: str) -> str:
    return (REC / name).read_text()


def by_key(readings):
    return {(r.device_id, r.chip_id): r for r in readings}


def test_910b2c_hbm_column_and_trailing_spaces():
    devs = by_key(parse(rec("910b2c-23.0.2.1-with-processes.txt")))
    assert set(devs) == {(0, 0), (1, 0)}
    d0 = devs[(0, 0)]
    assert (d0.vendor, d0.name, d0.health) == ("npu", "910B2C", "OK")
    assert d0.power_watts == 88.6 and d0.temperature_celsius == 51.0
    assert d0.utilization_ratio == 0.0
    assert d0.bus_id == "0000:5A:00.0"
    # "20701/ 65536" in the HBM-Usage(MB) column: the number runs into the slash.
    assert (d0.hbm_used_bytes, d0.hbm_total_bytes) == (20701 * MIB, 65536 * MIB)
    assert (d0.memory_used_bytes, d0.memory_total_bytes) == (20701 * MIB, 65536 * MIB)
    # DDR printed "0 / 0": the chip has no DDR to report, so nothing (not 0).
    assert d0.ddr_used_bytes is None and d0.ddr_total_bytes is None
    assert devs[(1, 0)].power_watts == 99.6 and devs[(1, 0)].hbm_used_bytes == 20687 * MIB
    assert devs[(1, 0)].bus_id == "0000:19:00.0"


def test_910b2c_process_table():
    procs = parse_processes(rec("910b2c-23.0.2.1-with-processes.txt"))
    assert [(p.device_id, p.chip_id, p.pid, p.name, p.memory_used_bytes) for p in procs] == [
        (0, 0, 124528, "python3.8", 17400 * MIB)]


def test_310b4_alarm_na_bus_and_ddr_only():
    (d,) = parse(rec("310b4-23.0.0-alarm.txt"))
    assert (d.device_id, d.chip_id, d.name, d.health) == (0, 0, "310B4", "Alarm")
    assert d.power_watts == 0.0  # printed 0.0: a real reading, unlike NA
    assert d.temperature_celsius == 65.0
    assert d.bus_id is None  # "NA"
    assert (d.memory_used_bytes, d.memory_total_bytes) == (3628 * MIB, 15609 * MIB)
    assert (d.ddr_used_bytes, d.ddr_total_bytes) == (3628 * MIB, 15609 * MIB)
    assert d.hbm_total_bytes is None
    assert d.logical_id == 0  # "Device" column


def test_a3_two_chips_phy_id_and_dash_power():
    devs = by_key(parse(rec("a3-ascend910-25.2.0-two-chips.txt")))
    assert set(devs) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert devs[(0, 0)].power_watts == 162.8
    assert devs[(0, 1)].power_watts is None  # "-"
    assert devs[(1, 0)].power_watts == 167.1
    assert devs[(1, 1)].power_watts is None
    assert devs[(0, 1)].bus_id == "0000:9E:00.0"
    assert devs[(1, 1)].hbm_used_bytes == 10568 * MIB
    assert devs[(0, 0)].name == "Ascend910"
    assert devs[(0, 1)].logical_id is None  # Phy-ID is not the logical index


def test_a3_processes_skip_no_running_line():
    procs = parse_processes(rec("a3-ascend910-25.2.0-two-chips.txt"))
    assert [(p.device_id, p.chip_id, p.pid, p.name, p.memory_used_bytes) for p in procs] == [
        (1, 1, 990711, "python", 7746 * MIB)]


def test_310p3_duo_na_power_and_memory_touching_slash():
    devs = by_key(parse(rec("310p3-duo-24.1.0.1-processes.txt")))
    assert set(devs) == {(1, 0), (1, 1), (2, 0), (2, 1)}
    assert all(d.power_watts is None for d in devs.values())  # "NA"
    assert devs[(1, 0)].memory_used_bytes == 16302 * MIB
    assert devs[(1, 0)].memory_total_bytes == 44280 * MIB
    assert devs[(1, 1)].memory_total_bytes == 43693 * MIB
    assert devs[(2, 0)].memory_used_bytes == 35563 * MIB
    assert [devs[k].logical_id for k in sorted(devs)] == [0, 1, 2, 3]
    assert devs[(2, 1)].bus_id == "0000:02:00.0"
    assert devs[(2, 0)].temperature_celsius == 61.0


def test_310p3_duo_per_chip_processes():
    procs = parse_processes(rec("310p3-duo-24.1.0.1-processes.txt"))
    assert [(p.device_id, p.chip_id, p.pid, p.memory_used_bytes) for p in procs] == [
        (1, 0, 3277562, 14513 * MIB), (1, 1, 3277565, 14513 * MIB),
        (2, 0, 3034986, 34207 * MIB), (2, 1, 3034989, 33740 * MIB)]
    assert {p.name for p in procs} == {"mindie_llm_back"}


def test_910b3_wide_frame_with_hbm_and_wider_cell():
    (d,) = parse(rec("910b3-25.2.3-wide-frame.txt"))
    assert (d.device_id, d.chip_id, d.name) == (3, 0, "910B3")
    assert d.power_watts == 92.8 and d.temperature_celsius == 36.0
    assert (d.memory_used_bytes, d.memory_total_bytes) == (3198 * MIB, 65536 * MIB)
    assert parse_processes(rec("910b3-25.2.3-wide-frame.txt")) == []


def test_300i_duo_cut_off_shared_bus_different_totals():
    devs = by_key(parse(rec("300i-duo-310p3-25.2.0.txt")))
    assert set(devs) == {(2, 0), (2, 1)}
    assert devs[(2, 0)].bus_id == devs[(2, 1)].bus_id == "0000:01:00.0"
    assert devs[(2, 0)].memory_total_bytes == 44280 * MIB
    assert devs[(2, 1)].memory_total_bytes == 43693 * MIB
    assert devs[(2, 0)].temperature_celsius == 45.0 and devs[(2, 1)].temperature_celsius == 43.0


def test_310_no_processes():
    (d,) = parse(rec("310-23.0.0-no-processes.txt"))
    assert (d.name, d.power_watts, d.temperature_celsius) == ("310", 12.8, 61.0)
    assert (d.memory_used_bytes, d.memory_total_bytes) == (577 * MIB, 7759 * MIB)
    assert parse_processes(rec("310-23.0.0-no-processes.txt")) == []


def test_200i_a2():
    (d,) = parse(rec("200i-a2-310b1-23.0.rc3.txt"))
    assert (d.name, d.power_watts, d.temperature_celsius, d.bus_id) == ("310B1", 10.4, 66.0, None)
    assert d.memory_total_bytes == 10810 * MIB


# A layout not in the recordings (quirk 1): "NPU ID" column, "NPU Util(%)", one line per device,
# N/A spellings (quirk 4) and a name with a space.
NEWER = """\
+-------------------------------------------------------------------------------------+
| npu-smi 26.0.0                 Version: 26.0.0                                      |
+-----------+-------------+----------+-------------------+----------------------------+
| NPU ID Chip | Name        | Health   | Power(W)  Temp(C) | NPU Util(%) HBM-Usage(MB)  |
+===========+=============+==========+===================+============================+
| 224   0   | Ascend 910C | Warning  | [N/A]     55      | 45          1024 /65536    |
+-----------+-------------+----------+-------------------+----------------------------+
| 32768 1   | Ascend 910C | critical | 301.5     N/A     | N/A         N/A / 65536    |
+===========+=============+==========+===================+============================+
"""


def test_unknown_layout_found_by_header_names():
    devs = by_key(parse(NEWER))
    assert set(devs) == {(224, 0), (32768, 1)}
    a, b = devs[(224, 0)], devs[(32768, 1)]
    assert a.name == "Ascend 910C" and a.health == "Warning"
    assert a.power_watts is None and a.temperature_celsius == 55.0 and a.utilization_ratio == 0.45
    assert (a.memory_used_bytes, a.memory_total_bytes) == (1024 * MIB, 65536 * MIB)
    assert b.health == "Critical" and b.power_watts == 301.5
    assert b.temperature_celsius is None and b.utilization_ratio is None
    assert b.memory_used_bytes is None and b.memory_total_bytes == 65536 * MIB


def test_cut_off_mid_row_keeps_complete_rows_and_flags_the_rest():
    text = rec("910b2c-23.0.2.1-with-processes.txt").splitlines()
    # Keep the first device and half of the second device's first line.
    cut = "\n".join(text[:10]) + "\n| 1     910B2C              | OK            | 99"
    table = parse_table(cut)
    assert [(d.device_id, d.chip_id) for d in table.devices] == [(0, 0)]
    assert len(table.problems) == 1 and "incomplete" in table.problems[0]


def test_retyped_health_is_none_not_ok_and_collapsed_spaces_still_parse():
    text = rec("310-23.0.0-no-processes.txt").replace("| OK ", "| 0K ")
    text = text.replace("12.8         61", "12.8 61")
    (d,) = parse(text)
    assert d.health is None
    assert (d.power_watts, d.temperature_celsius) == (12.8, 61.0)


def test_blank_value_does_not_shift_the_others():
    # Power blank: 2 values for Power/Temp/Hugepages; the pair still lands on Hugepages, but which of
    # Power/Temp is missing cannot be known, so neither is guessed.
    text = rec("310-23.0.0-no-processes.txt").replace("12.8         61", "             61")
    (d,) = parse(text)
    assert d.power_watts is None and d.temperature_celsius is None
    assert d.memory_total_bytes == 7759 * MIB


@pytest.mark.parametrize("text", [
    "", "hello", "NPU Name Health\n0 910B OK",
    "+=====+\n| NPU Name | Health |\n+=====+\n",
    rec("info-m-mapping.txt"), rec("t-power-910b.txt"),
])
def test_no_device_row_raises_parse_error(text):
    with pytest.raises(ParseError):
        parse(text)
    assert issubclass(ParseError, ValueError)


def test_header_only_error_names_the_problem():
    text = "\n".join(rec("910b2c-23.0.2.1-with-processes.txt").splitlines()[:6])
    with pytest.raises(ParseError, match="no complete device row"):
        parse(text)


def test_json_document_with_same_fields():
    doc = {"devices": [
        {"npu_id": 32, "chip_id": 1, "name": "910B3", "health": "ok", "power_watts": 90,
         "utilization_ratio": 0.5, "memory_used_bytes": 1024, "memory_total_bytes": 2048},
        {"device_id": 33, "utilization_ratio": 55, "power_watts": "90", "memory_used_bytes": -1,
         "temperature_celsius": True},
        {"name": "no id"},
    ]}
    a, b = parse(json.dumps(doc))
    assert (a.device_id, a.chip_id, a.name, a.health, a.power_watts) == (32, 1, "910B3", "OK", 90.0)
    assert (a.utilization_ratio, a.memory_used_bytes, a.memory_total_bytes) == (0.5, 1024, 2048)
    assert (b.device_id, b.chip_id) == (33, 0)
    # wrong range / type: dropped, not coerced
    assert b.utilization_ratio is None and b.power_watts is None
    assert b.memory_used_bytes is None and b.temperature_celsius is None


@pytest.mark.parametrize("text", ["[]", "{}", '{"devices": 3}', "[1, 2]", "{not json", "[" * 5000])
def test_bad_json_raises_parse_error(text):
    with pytest.raises(ParseError):
        parse(text)
