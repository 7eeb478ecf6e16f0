"""npu-smi -t ecc/health/usages and hccn_tool parsers on the recordings in tests/fakes/ascend-tools/; every
expected value is typed from the recording (and its expected.json entry), converted to base units by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from npudist.telemetry import ParseError
from npudist.telemetry.sources.hccn import (
    parse_ip,
    parse_link,
    parse_link_stat,
    parse_net_health,
    parse_optical,
    parse_speed,
    parse_stat,
)
from npudist.telemetry.sources.measurements import Measurement
from npudist.telemetry.sources.npu_smi.reliability import parse_ecc, parse_health, parse_usages

REC = Path(__file__).resolve().parents[1] / "fakes" / "ascend-tools"


def rec(name: str) -> str:
    return (REC / name).read_text()


def values(found: list[Measurement]) -> dict[tuple, float]:
    """{(family without npudist_, labels..., chip): value}."""
    return {(x.metric.removeprefix("npudist_"), *(v for _, v in x.labels), x.chip_id): x.value for x in found}


# --- npu-smi info -t ecc -------------------------------------------------------------------------------------
def test_ecc_mindcluster_doc_ddr_and_hbm_rows_of_chip_0():
    got = values(parse_ecc(rec("npu-smi-ecc-mindclusterdoc-1.txt")))
    assert got[("device_ecc_uncorrected_errors_total", "hbm", 0)] == 0
    assert got[("device_ecc_aggregate_corrected_errors_total", "ddr", 0)] == 0
    assert got[("device_memory_retired_pages", "hbm", "double_bit", 0)] == 0
    assert len(got) == 12  # 6 DDR + 6 HBM rows; NPU ID and Chip Count are not counts of errors


def test_ecc_950_next_isolated_pages_without_chip_id():
    got = values(parse_ecc(rec("npu-smi-ecc-driver950doc-1.txt")))
    assert got[("device_memory_pending_retirement_pages", "hbm", "single_bit", None)] == 0
    assert got[("device_ecc_aggregate_uncorrected_errors_total", "hbm", None)] == 0
    assert len(got) == 8


def test_ecc_310b_unprefixed_rows_are_its_ddr():
    got = values(parse_ecc(rec("npu-smi-ecc-hiascend200ia2-1.txt")))
    assert got == {("device_ecc_corrected_errors_total", "ddr", None): 0,
                   ("device_ecc_uncorrected_errors_total", "ddr", None): 0}


def test_ecc_non_zero_and_hostile_counts():
    text = ("\tHBM Double Bit Error Count               : 7\n\tHBM Single Bit Error Count               : -3\n"
            "\tHBM Single Bit Aggregate Total Err Cnt   : " + "9" * 400 + "\n")
    assert values(parse_ecc(text)) == {("device_ecc_uncorrected_errors_total", "hbm", None): 7}
    with pytest.raises(ParseError):
        parse_ecc("Error: invalid type ecc\n")


# --- npu-smi info -t health ------------------------------------------------------------------------------------
def test_health_alarm_with_three_codes_and_continuation_lines():
    got = values(parse_health(rec("npu-smi-health-mindcluster-2.txt")))
    assert got[("device_alarm_level", None)] == 2  # Alarm = major
    assert got[("device_error_codes", None)] == 3
    assert {k[1] for k in got if k[0] == "device_error_code_info"} == {"A4025021", "8C03A000", "8C084E00"}


@pytest.mark.parametrize("name", ["npu-smi-health-mindcluster-1.txt", "npu-smi-health-driver950doc-1.txt"])
def test_health_ok_chip_form_and_950_health_key(name):
    assert values(parse_health(rec(name))) == {("device_alarm_level", None): 0, ("device_error_codes", None): 0}


def test_health_refuses_unknown_level_and_non_hex_codes():
    with pytest.raises(ParseError):
        parse_health("\tHealth Status : 0K\n")  # a retyped OK is not OK
    with pytest.raises(ParseError):
        parse_health("\tHealth Status : Critical\n\tError Code : $(reboot)\n")
    codes = " ".join(f"{i:08X}" for i in range(40))
    got = values(parse_health(f"\tHealth Status : Critical\n\tError Code : {codes}\n"))
    assert got[("device_alarm_level", None)] == 3 and got[("device_error_codes", None)] == 40
    assert sum(k[0] == "device_error_code_info" for k in got) == 16  # series stay bounded


# --- npu-smi info -t usages ------------------------------------------------------------------------------------
def test_usages_950_splits_vector_cube_and_overall():
    got = values(parse_usages(rec("npu-smi-usages-driver950doc-1.txt")))
    assert got[("device_ctrlcpu_utilization_ratio", None)] == pytest.approx(0.40)
    assert got[("device_hbm_bandwidth_utilization_ratio", None)] == pytest.approx(0.03)
    assert got[("device_aicube_utilization_ratio", None)] == 0
    assert got[("device_overall_utilization_ratio", None)] == 0


def test_usages_telegraf_capture_chip_0():
    got = values(parse_usages(rec("npu-smi-usages-telegraf-1.txt")))
    assert got[("device_ctrlcpu_utilization_ratio", 0)] == pytest.approx(0.06)
    assert got[("device_aivector_utilization_ratio", 0)] == 0


def test_usages_310b_memory_bandwidth_is_ddr_and_910a_has_no_vector_line():
    got = values(parse_usages(rec("npu-smi-usages-hiascend200ia2-1.txt")))
    assert got[("device_ddr_bandwidth_utilization_ratio", None)] == pytest.approx(0.01)
    assert got[("device_ctrlcpu_utilization_ratio", None)] == pytest.approx(0.86)
    assert not any(k[0] == "device_aivector_utilization_ratio"
                   for k in values(parse_usages(rec("npu-smi-usages-mindcluster-1.txt"))))
    assert values(parse_usages(rec("npu-smi-usages-arthurchiao-1.txt")))[
        ("device_aivector_utilization_ratio", 0)] == 0


def test_usages_out_of_range_percent_is_missing():
    assert values(parse_usages("Aicpu Usage Rate(%) : 250\nCtrlcpu Usage Rate(%) : 5\n")) == {
        ("device_ctrlcpu_utilization_ratio", None): pytest.approx(0.05)}


# --- hccn_tool -link / -link_stat ------------------------------------------------------------------------------
def test_link_up_and_down():
    assert values(parse_link(rec("hccn_tool-link-mindclusterdoc-1.txt"))) == {("link_up", None): 1}
    assert values(parse_link(rec("hccn_tool-link-driver950doc-1.txt"))) == {("link_up", None): 0}
    with pytest.raises(ParseError):
        parse_link("link status: SIDEWAYS\n")


@pytest.mark.parametrize("name", ["hccn_tool-link_stat-mindcluster-1.txt", "hccn_tool-link_stat-mindcluster-2.txt",
                                  "hccn_tool-link_stat-mindclusterdoc-1.txt",
                                  "hccn_tool-link_stat-mindclusterdoc-2.txt"])
def test_link_stat_older_format_up_count_only(name):
    # No `link down count` line: it is not invented from the change records (they hold only the latest).
    assert values(parse_link_stat(rec(name))) == {("link_up_events_total", None): 2}


def test_link_stat_newer_format_and_950_table():
    assert values(parse_link_stat(rec("hccn_tool-link_stat-hccldoc-1.txt"))) == {
        ("link_up_events_total", None): 2, ("link_down_events_total", None): 1}
    assert values(parse_link_stat(rec("hccn_tool-link_stat-driver950doc-1.txt"))) == {
        ("link_up_events_total", "4", None): 2, ("link_down_events_total", "4", None): 2}


# --- hccn_tool -stat -------------------------------------------------------------------------------------------
def test_stat_injected_roce_errors():
    assert values(parse_stat(rec("hccn_tool-stat-mindcluster-2.txt"))) == {
        ("link_roce_error_packets_total", "rx", None): 13, ("link_roce_error_packets_total", "tx", None): 77}


def test_stat_doc_with_elision_counts_only_printed_counters():
    got = values(parse_stat(rec("hccn_tool-stat-mindclusterdoc-1.txt")))
    assert got == {("link_pause_frames_total", "tx", None): 0, ("link_pause_frames_total", "rx", None): 0,
                   ("link_pfc_frames_total", "tx", None): 0, ("link_roce_qp_status_errors_total", None): 0,
                   ("link_nic_packets_total", "tx", None): 122404, ("link_nic_bytes_total", "tx", None): 16921741,
                   ("link_nic_packets_total", "rx", None): 6414803, ("link_nic_bytes_total", "rx", None): 482237805}


def test_stat_per_priority_pfc_and_hostile_lines():
    text = "packet statistics:\nmac_rx_pfc_pri3_pkt_num:42\nroce_new_pkt_rty_num:-1\nroce_rx_err_pkt_num:1e9\n"
    assert values(parse_stat(text)) == {("link_pfc_priority_frames_total", "rx", "3", None): 42}
    with pytest.raises(ParseError):
        parse_stat("packet statistics:\n...\n")


# --- hccn_tool -optical ----------------------------------------------------------------------------------------
def test_optical_units_lanes_limits_and_flags():
    got = values(parse_optical(rec("hccn_tool-optical-mindcluster-1.txt")))
    assert got[("link_optical_tx_power_watts", "0", None)] == pytest.approx(4.4035e-3)  # 4.4035 mW
    assert got[("link_optical_rx_power_watts", "1", None)] == pytest.approx(0.0054e-3)
    assert got[("link_optical_supply_voltage_volts", None)] == pytest.approx(3.2629)  # 3262.90 mV
    assert got[("link_optical_tx_bias_amperes", "3", None)] == pytest.approx(7.924e-3)  # 7.9240 mA
    assert got[("link_optical_temperature_celsius", None)] == 47
    assert got[("link_optical_rx_power_limit_watts", "low", None)] == pytest.approx(0.1445e-3)
    assert got[("link_optical_supply_voltage_limit_volts", "high", None)] == pytest.approx(3.465)
    assert got[("link_optical_media_snr_decibels", "2", None)] == pytest.approx(22.1875)
    assert not any(k[0] == "link_optical_host_snr_decibels" for k in got)  # "not supported"
    assert got[("link_optical_signal_lost", "rx", "0", None)] == 1  # Rx Los Flag 0xff
    assert got[("link_optical_signal_lost", "tx", "0", None)] == 0
    assert got[("link_optical_present", None)] == 0  # printed "not present" (see tests/fakes/README.md)


def test_optical_dbm_is_converted_to_watts():
    got = values(parse_optical("Tx Power0 : 0.00 dBm\nRx Power0 : -10 dBm\n"))
    assert got[("link_optical_tx_power_watts", "0", None)] == pytest.approx(1e-3)
    assert got[("link_optical_rx_power_watts", "0", None)] == pytest.approx(1e-4)
    with pytest.raises(ParseError):
        parse_optical("optical info:\nvendor name : Hisense\n")


# --- hccn_tool -net_health / -speed / -ip ----------------------------------------------------------------------
@pytest.mark.parametrize("name, status, healthy", [
    ("hccn_tool-net_health-mindclusterdoc-3.txt", "success", 1),
    ("hccn_tool-net_health-mindcluster-1.txt", "socket_fail", 0),  # fixture "Socket failed", source "Socket fail"
    ("hccn_tool-net_health-mindclusterdoc-1.txt", "init", 0),
    ("hccn_tool-net_health-mindclusterdoc-2.txt", "fault", 0),
])
def test_net_health(name, status, healthy):
    assert values(parse_net_health(rec(name))) == {("link_net_healthy", None): healthy,
                                                  ("link_net_health_info", status, None): 1}


def test_speed_classic_line_and_950_table():
    # hccn_tool.go documents `Speed: 100000 Mb/s`; no recording exists (tests/fakes/README.md).
    assert values(parse_speed("Speed: 100000 Mb/s\n")) == {("link_speed_bytes_per_second", None): 1.25e10}
    assert values(parse_speed(rec("hccn_tool-speed-driver950doc-1.txt"))) == {
        ("link_speed_bytes_per_second", "4", None): 400e9 / 8}
    with pytest.raises(ParseError):
        parse_speed("Speed: fast\n")


@pytest.mark.parametrize("name, address, netmask", [
    ("hccn_tool-ip-mindcluster-1.txt", "192.161.200.10", "255.255.255.0"),
    ("hccn_tool-ip-mindcluster-2.txt", "192.1.45.172", "255.255.0.0"),
    ("hccn_tool-ip-arthurchiao-1.txt", "29.1.112.213", "255.255.0.0"),
])
def test_ip(name, address, netmask):
    assert values(parse_ip(rec(name))) == {("link_info", address, netmask, None): 1}


def test_ip_refuses_non_addresses():
    for text in ("ipaddr:999.1.1.1\nnetmask:255.255.0.0\n", "ipaddr:10.0.0.1\nnetmask:255.0.255.0\n", ""):
        with pytest.raises(ParseError):
            parse_ip(text)
