"""`npu-smi info -t ...` key/value parsers and the `info -m` map; expected values typed from recordings."""

from __future__ import annotations

from pathlib import Path

import pytest

from npudist.telemetry import DeviceReading, ParseError
from npudist.telemetry.sources.npu_smi import (
    merge_readings,
    parse,
    parse_kv,
    parse_kv_blocks,
    parse_mapping,
    with_logical_ids,
)

REC = Path(__file__).resolve().parents[1] / "fakes" / "npu-smi"
MIB = 1048576


def rec(name: str) -> str:
    return (REC / name).read_text()


def only(readings: list[DeviceReading]) -> DeviceReading:
    assert len(readings) == 1
    return readings[0]


def test_power_910b_chip_id_after_fields():
    r = only(parse_kv(rec("t-power-910b.txt")))
    assert (r.device_id, r.chip_id, r.power_watts) == (0, 0, 103.5)
    assert r.temperature_celsius is None


def test_power_310b1_chip_id_first_and_mcu_power_dissipation_ignored():
    r = only(parse_kv(rec("t-power-310b1-doc.txt")))
    assert (r.device_id, r.chip_id, r.power_watts) == (0, 0, 9.1)  # not the MCU block's 16.9


def test_temp_910b_npu_temperature_key_and_mcu_block_skipped():
    r = only(parse_kv(rec("t-temp-910b.txt")))
    assert r.temperature_celsius == 39.0  # not LM75 36


def test_temp_310b1_spaced_key():
    assert only(parse_kv(rec("t-temp-310b1-doc.txt"))).temperature_celsius == 50.0


def test_common_910b_mcu_block_first_line():
    r = only(parse_kv(rec("t-common-910b.txt")))
    assert (r.temperature_celsius, r.power_watts) == (46.0, 69.0)  # MCU block has 48 and 45.2
    assert r.utilization_ratio == 0.0
    assert r.frequency_hertz == 1000e6  # Aicore curFreq(MHZ) 1000


def test_usages_910b_capacity_but_no_used_bytes():
    r = only(parse_kv(rec("t-usages-910b.txt")))
    assert r.hbm_total_bytes == 65536 * MIB and r.memory_total_bytes == 65536 * MIB
    assert r.ddr_total_bytes is None  # DDR Capacity 0
    assert r.memory_used_bytes is None  # only a percentage is printed
    assert r.utilization_ratio == 0.0


def test_usages_310b1_memory_capacity():
    r = only(parse_kv(rec("t-usages-310b1-doc.txt")))
    assert r.memory_total_bytes == 10810 * MIB and r.hbm_total_bytes is None


def test_memory_910b_npu_id_1():
    r = only(parse_kv(rec("t-memory-910b.txt")))
    assert (r.device_id, r.chip_id, r.hbm_total_bytes) == (1, 0, 32768 * MIB)


def test_health_needs_the_callers_ids():
    with pytest.raises(ParseError, match="npu_id"):
        parse_kv(rec("t-health-ok.txt"))
    r = only(parse_kv(rec("t-health-warning.txt"), npu_id=5, chip_id=1))
    assert (r.device_id, r.chip_id, r.health) == (5, 1, "Warning")
    assert only(parse_kv(rec("t-health-ok.txt"), npu_id=0)).health == "OK"


def test_printed_ids_win_over_callers():
    r = only(parse_kv(rec("t-memory-910b.txt"), npu_id=7, chip_id=3))
    assert (r.device_id, r.chip_id) == (1, 0)


def test_two_chip_blocks():
    text = ("NPU ID : 4\nChip Count : 2\n\nChip ID : 0\nTemperature(C) : 40\n\n"
            "Chip ID : 1\nTemperature (C) : NA\n\nChip Name : mcu\nTemperature(C) : 50\n")
    a, b = parse_kv(text)
    assert (a.device_id, a.chip_id, a.temperature_celsius) == (4, 0, 40.0)
    assert (b.device_id, b.chip_id, b.temperature_celsius) == (4, 1, None)


def test_blocks_normalise_keys():
    blocks = parse_kv_blocks(rec("t-temp-310b1-doc.txt"))
    assert blocks[0] == {"npu id": "0", "chip count": "1"}
    assert blocks[1] == {"chip id": "0", "temperature(c)": "50"}
    assert blocks[2]["tec_temp(c)"] == "NA" and blocks[2]["chip name"] == "MCU"


@pytest.mark.parametrize("text", ["", "NPU ID : 0\nChip Count : 1\n", "garbage", rec("info-m-mapping.txt")])
def test_kv_without_values_raises(text):
    with pytest.raises(ParseError):
        parse_kv(text, npu_id=0)


def test_mapping():
    assert parse_mapping(rec("info-m-mapping.txt")) == {(3, 0): 0, (4, 0): 1}


@pytest.mark.parametrize("text", ["", "NPU ID   Chip ID   Chip Logic ID   Chip Name\n3  1  -  Mcu\n",
                                  rec("t-power-910b.txt")])
def test_mapping_errors(text):
    with pytest.raises(ParseError):
        parse_mapping(text)


def test_merge_table_queries_and_map():
    table = parse(rec("910b3-25.2.3-wide-frame.txt"))  # NPU 3 chip 0
    power = parse_kv(rec("t-power-910b.txt"), npu_id=3)  # printed NPU ID 0: another card
    health = parse_kv(rec("t-health-warning.txt"), npu_id=3, chip_id=0)
    merged = with_logical_ids(merge_readings(table, power, health), parse_mapping(rec("info-m-mapping.txt")))
    by = {(r.device_id, r.chip_id): r for r in merged}
    assert by[(3, 0)].health == "OK"  # the table's own value wins over the later query
    assert by[(3, 0)].power_watts == 92.8
    assert by[(3, 0)].logical_id == 0
    assert by[(0, 0)].power_watts == 103.5 and by[(0, 0)].logical_id is None
