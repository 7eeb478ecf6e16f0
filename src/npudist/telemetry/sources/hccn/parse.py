"""Pure parsers for ``hccn_tool -i N -<query> -g`` outputs (the RoCE NIC of an Ascend NPU), as Measurements
in base units: counters as counts, speeds in bytes/s, optical power in watts, bias in amperes, supply in volts.

Formats, from the recordings in ``tests/fakes/ascend-tools/`` (sources in ``tests/fakes/README.md``) and the
fields MindCluster reads (``component/ascend-common/devmanager/hccn/hccn_tool.go``):
- ``-link``: ``link status: UP|DOWN``;
- ``-link_stat``: ``[devid N]`` (older docs ``[device N]``) before every line; ``link up count``, on newer
  drivers ``link down count``, then change records newest first; Ascend 950 prints the counts and a table
  with ``LINK_UP``/``LINK_DOWN``;
- ``-stat``: ``counter:value`` lines under ``packet statistics:`` (about 47 ``mac_*``, ``roce_*``, ``nic_*``
  counters; documentation copies elide some with ``...``);
- ``-optical``: ``key : value unit`` lines, four lanes (``Tx Power0``..``3``), hex loss flags;
- ``-net_health``: ``net health status: Success`` (or ``Socket fail[ed]``, ``Init``, ``Fault`` ...);
- ``-speed``: ``Speed: 100000 Mb/s`` (hccn_tool.go) or the 950 table (``400 G``);
- ``-ip``: ``ipaddr:A.B.C.D`` and ``netmask:A.B.C.D``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from types import MappingProxyType

from npudist.telemetry.sources import _values as v
from npudist.telemetry.sources.measurements import Measurement, m
from npudist.telemetry.sources.readings import ParseError

_PREFIX = re.compile(r"^\s*\[(?:devid|device)\s*\d+\]")


def _pairs(text: str, sep: str = ":") -> list[tuple[str, str]]:
    """(normalised key, raw value) per ``key SEP value`` line, the ``[devid N]`` prefix removed."""
    out = []
    for line in text.splitlines():
        key, found, raw = _PREFIX.sub("", line).partition(sep)
        if found and key.strip():
            out.append((re.sub(r"\s+", " ", key.strip().lower()), raw.strip()))
    return out


_LINK_STATES = MappingProxyType({"up": 1, "down": 0})


def parse_link(text: str) -> list[Measurement]:
    """``-link -g``: npudist_link_up 1/0; ParseError without a ``link status`` of UP or DOWN."""
    for key, raw in _pairs(text):
        if key == "link status" and raw.lower() in _LINK_STATES:
            return m("npudist_link_up", _LINK_STATES[raw.lower()])
    raise ParseError("no `link status: UP|DOWN` line")


def _table_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of an ASCII table (``| a | b |`` lines between ``+---+`` borders)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.strip().startswith("|")]
    return ([h.lower() for h in rows[0]], rows[1:]) if rows else ([], [])


def parse_link_stat(text: str) -> list[Measurement]:
    """``-link_stat -g``: link up (and, where printed, down) transitions since the driver loaded. Down
    events are never derived from the change records: they hold only the latest few."""
    out: list[Measurement] = []
    counts = {"link up count": "npudist_link_up_events_total", "link down count": "npudist_link_down_events_total"}
    for key, raw in _pairs(text):
        if key in counts:
            count = v.integer(raw)
            out += m(counts.pop(key), count if count is not None and count >= 0 else None)
    header, rows = _table_rows(text)
    port = header.index("port") if "port" in header else None
    if port is not None and rows and len(rows[0]) > port:
        out = [Measurement(x.metric, x.value, (("port", rows[0][port]),)) for x in out]
    if not out:
        raise ParseError("no `link up count` line with a count")
    return out


def _direction_counters() -> dict[str, tuple[str, dict[str, str]]]:
    table: dict[str, tuple[str, dict[str, str]]] = {}
    for d in ("rx", "tx"):
        both = {"direction": d}
        table |= {
            f"mac_{d}_mac_pause_num": ("npudist_link_pause_frames_total", both),
            f"mac_{d}_pfc_pkt_num": ("npudist_link_pfc_frames_total", both),
            f"mac_{d}_total_pkt_num": ("npudist_link_mac_packets_total", both),
            f"mac_{d}_total_oct_num": ("npudist_link_mac_bytes_total", both),
            f"mac_{d}_bad_pkt_num": ("npudist_link_mac_bad_packets_total", both),
            f"mac_{d}_bad_oct_num": ("npudist_link_mac_bad_bytes_total", both),
            f"roce_{d}_all_pkt_num": ("npudist_link_roce_packets_total", both),
            f"roce_{d}_rc_pkt_num": ("npudist_link_roce_rc_packets_total", both),
            f"roce_{d}_err_pkt_num": ("npudist_link_roce_error_packets_total", both),
            f"roce_{d}_cnp_pkt_num": ("npudist_link_roce_cnp_packets_total", both),
            f"nic_{d}_all_pkg_num": ("npudist_link_nic_packets_total", both),
            f"nic_{d}_all_oct_num": ("npudist_link_nic_bytes_total", both),
        }
        for p in range(8):
            table[f"mac_{d}_pfc_pri{p}_pkt_num"] = ("npudist_link_pfc_priority_frames_total",
                                                   {"direction": d, "priority": str(p)})
    return table


STAT_COUNTERS: Mapping[str, tuple[str, Mapping[str, str]]] = v.frozen({
    **_direction_counters(),
    "mac_rx_fcs_err_pkt_num": ("npudist_link_mac_fcs_errors_total", {}),
    "roce_cqe_num": ("npudist_link_roce_completions_total", {}),
    "roce_new_pkt_rty_num": ("npudist_link_roce_retransmits_total", {}),
    "roce_ecn_db_num": ("npudist_link_roce_ecn_marked_packets_total", {}),
    "roce_verification_err_num": ("npudist_link_roce_verification_errors_total", {}),
    # Older drivers name these roce_err_ack_num / roce_err_psn_num / roce_err_qp_status_num, newer ones
    # roce_unexpected_ack_num / roce_out_of_order_num / roce_qp_status_err_num (the driver's
    # dcmi_network_pkt_stats_info struct and MindCluster's npu-exporter respectively).
    "roce_err_ack_num": ("npudist_link_roce_unexpected_acks_total", {}),
    "roce_unexpected_ack_num": ("npudist_link_roce_unexpected_acks_total", {}),
    "roce_err_psn_num": ("npudist_link_roce_out_of_order_packets_total", {}),
    "roce_out_of_order_num": ("npudist_link_roce_out_of_order_packets_total", {}),
    "roce_err_qp_status_num": ("npudist_link_roce_qp_status_errors_total", {}),
    "roce_qp_status_err_num": ("npudist_link_roce_qp_status_errors_total", {}),
})
"""hccn_tool ``-stat`` counter -> (family, labels). Counters not listed are ignored."""


def parse_stat(text: str) -> list[Measurement]:
    """``-stat -g``: MAC, PFC, RoCE and NIC counters; ParseError when no known counter has a count."""
    out: list[Measurement] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for key, raw in _pairs(text):
        if key not in STAT_COUNTERS:
            continue
        family, labels = STAT_COUNTERS[key]
        count = v.integer(raw)
        if count is None or count < 0 or (family, tuple(labels.items())) in seen:
            continue
        seen.add((family, tuple(labels.items())))
        out += m(family, count, **labels)
    if not out:
        raise ParseError("no known `hccn_tool -stat` counter (e.g. roce_rx_err_pkt_num:0) with a count")
    return out


# Fullmatched against a stripped value with one run of blanks: two adjacent \s* runs would backtrack
# quadratically on a value like `1<120k spaces>!` and hold the GIL (and /metrics) for a minute.
_NUMBER_UNIT = re.compile(r"([+-]?\d{1,20}(?:\.\d{1,20})?)[ \t]*([A-Za-z]{0,8})")
_POWER_TO_WATTS = MappingProxyType({"mw": 1e-3, "w": 1.0, "uw": 1e-6})


def _quantity(raw: str, scale: Mapping[str, float], default: str) -> float | None:
    """``4.4035 mW`` -> 0.0044035 with scale {'mw': 1e-3}; ``dBm`` is converted as power; None otherwise."""
    match = _NUMBER_UNIT.fullmatch(raw.strip())
    if match is None:
        return None
    number = v.number(match.group(1))
    unit = (match.group(2) or default).lower()
    if number is None:
        return None
    if unit == "dbm" and scale is _POWER_TO_WATTS:
        return v.finite(10 ** (number / 10) / 1000)  # dBm: 10*log10(P / 1 mW)
    return v.finite(number * scale[unit]) if unit in scale else None


_OPTICAL_SCALAR: Mapping[str, tuple[str, Mapping[str, float], str, Mapping[str, str]]] = v.frozen({
    # printed key -> (family, unit scale to base, unit when none printed, labels)
    "temperature": ("npudist_link_optical_temperature_celsius", {"c": 1.0}, "c", {}),
    "vcc": ("npudist_link_optical_supply_voltage_volts", {"mv": 1e-3, "v": 1.0}, "mv", {}),
    "vcc high thres": ("npudist_link_optical_supply_voltage_limit_volts", {"mv": 1e-3, "v": 1.0}, "mv",
                       {"limit": "high"}),
    "vcc low thres": ("npudist_link_optical_supply_voltage_limit_volts", {"mv": 1e-3, "v": 1.0}, "mv",
                      {"limit": "low"}),
    "temp high thres": ("npudist_link_optical_temperature_limit_celsius", {"c": 1.0}, "c", {"limit": "high"}),
    "temp low thres": ("npudist_link_optical_temperature_limit_celsius", {"c": 1.0}, "c", {"limit": "low"}),
    "txpower high thres": ("npudist_link_optical_tx_power_limit_watts", _POWER_TO_WATTS, "mw", {"limit": "high"}),
    "txpower low thres": ("npudist_link_optical_tx_power_limit_watts", _POWER_TO_WATTS, "mw", {"limit": "low"}),
    "rxpower high thres": ("npudist_link_optical_rx_power_limit_watts", _POWER_TO_WATTS, "mw", {"limit": "high"}),
    "rxpower low thres": ("npudist_link_optical_rx_power_limit_watts", _POWER_TO_WATTS, "mw", {"limit": "low"}),
})
_OPTICAL_LANE = re.compile(r"^(tx power|rx power|tx bias|media snr lane|host snr lane)\s*(\d)$")
_OPTICAL_LANE_FAMILIES: Mapping[str, tuple[str, Mapping[str, float], str]] = v.frozen({
    "tx power": ("npudist_link_optical_tx_power_watts", _POWER_TO_WATTS, "mw"),
    "rx power": ("npudist_link_optical_rx_power_watts", _POWER_TO_WATTS, "mw"),
    "tx bias": ("npudist_link_optical_tx_bias_amperes", {"ma": 1e-3, "a": 1.0}, "ma"),
    "media snr lane": ("npudist_link_optical_media_snr_decibels", {"db": 1.0}, "db"),
    "host snr lane": ("npudist_link_optical_host_snr_decibels", {"db": 1.0}, "db"),
})
_LOSS_FLAGS = MappingProxyType({
    "tx los flag": ("npudist_link_optical_signal_lost", "tx"),
    "rx los flag": ("npudist_link_optical_signal_lost", "rx"),
    "tx lol flag": ("npudist_link_optical_lock_lost", "tx"),
    "rx lol flag": ("npudist_link_optical_lock_lost", "rx"),
})
_PRESENT = MappingProxyType({"present": 1, "not present": 0})


def parse_optical(text: str) -> list[Measurement]:
    """``-optical -g``: module presence, temperature, supply, per-lane power/bias/SNR, loss flags per lane and
    the module's own limits; ParseError when nothing is readable. Identification strings are not exported."""
    out: list[Measurement] = []
    lanes: set[str] = set()
    flags: list[tuple[str, str, int]] = []
    for key, raw in _pairs(text):
        if key == "present" and raw.lower() in _PRESENT:
            out += m("npudist_link_optical_present", _PRESENT[raw.lower()])
        elif key in _OPTICAL_SCALAR:
            family, scale, default, labels = _OPTICAL_SCALAR[key]
            out += m(family, _quantity(raw, scale, default), **labels)
        elif (lane := _OPTICAL_LANE.match(key)) is not None:
            family, scale, default = _OPTICAL_LANE_FAMILIES[lane.group(1)]
            value = _quantity(raw, scale, default)
            if value is not None and not family.endswith("_decibels") and value < 0:
                value = None
            out += m(family, value, lane=lane.group(2))
            lanes.add(lane.group(2))
        elif key in _LOSS_FLAGS and re.fullmatch(r"0x[0-9a-fA-F]{1,4}", raw):
            family, direction = _LOSS_FLAGS[key]
            flags.append((family, direction, int(raw, 16)))
    for family, direction, bits in flags:  # bit i is lane i (SFF-8636 byte 3/4/5 layout)
        for lane_no in sorted(lanes, key=int):
            out += m(family, (bits >> int(lane_no)) & 1, direction=direction, lane=lane_no)
    if not out:
        raise ParseError("no readable `hccn_tool -optical` value (e.g. 'Tx Power0 : 1.2 mW')")
    return out


_HEALTH_TEXT = re.compile(r"[A-Za-z][A-Za-z ]{0,39}")


def parse_net_health(text: str) -> list[Measurement]:
    """``-net_health -g``: npudist_link_net_healthy (1 only for ``Success``) and the status as a label
    (lower case, spaces as ``_``; ``Socket fail`` and the older ``Socket failed`` both ``socket_fail``)."""
    for key, raw in _pairs(text):
        if key == "net health status" and _HEALTH_TEXT.fullmatch(raw):
            status = re.sub(r"\s+", "_", raw.strip().lower()).replace("socket_failed", "socket_fail")
            return m("npudist_link_net_healthy", 1 if status == "success" else 0) + m(
                "npudist_link_net_health_info", 1, status=status)
    raise ParseError("no `net health status: WORD` line")


_SPEED = re.compile(r"^\s*(\d{1,9}(?:\.\d+)?)\s*(mb/s|gb/s|g|m|mbps|gbps)\s*$", re.IGNORECASE)
_BITS = MappingProxyType({"mb/s": 1e6, "m": 1e6, "mbps": 1e6, "gb/s": 1e9, "g": 1e9, "gbps": 1e9})


def _speed_bytes(raw: str) -> float | None:
    match = _SPEED.match(raw)
    return float(match.group(1)) * _BITS[match.group(2).lower()] / 8 if match else None


def parse_speed(text: str) -> list[Measurement]:
    """``-speed -g``: npudist_link_speed_bytes_per_second (the tool prints bits: Mb/s, or G in the 950 table)."""
    for key, raw in _pairs(text):
        if key == "speed" and (speed := _speed_bytes(raw)) is not None:
            return m("npudist_link_speed_bytes_per_second", speed)
    header, rows = _table_rows(text)
    if "speed" in header:
        out: list[Measurement] = []
        for row in rows:
            if len(row) == len(header) and (speed := _speed_bytes(row[header.index("speed")])) is not None:
                port = {"port": row[header.index("port")]} if "port" in header else {}
                out += m("npudist_link_speed_bytes_per_second", speed, **port)
        if out:
            return out
    raise ParseError("no `Speed: N Mb/s` line or speed table")


def parse_ip(text: str) -> list[Measurement]:
    """``-ip -g``: npudist_link_info{address, netmask} = 1; ParseError unless both are IPv4 addresses."""
    found = dict(_pairs(text))
    try:
        address = ipaddress.IPv4Address(found.get("ipaddr", ""))
        netmask = ipaddress.IPv4Network(f"0.0.0.0/{found.get('netmask', '')}").netmask
    except ValueError:
        raise ParseError("no `ipaddr:A.B.C.D` and `netmask:A.B.C.D` lines with IPv4 addresses") from None
    return m("npudist_link_info", 1, address=str(address), netmask=str(netmask))


PARSERS = MappingProxyType({
    "link": parse_link, "link_stat": parse_link_stat, "stat": parse_stat, "optical": parse_optical,
    "net_health": parse_net_health, "speed": parse_speed, "ip": parse_ip,
})
"""hccn_tool query (``-i N -QUERY -g``) -> parser."""
