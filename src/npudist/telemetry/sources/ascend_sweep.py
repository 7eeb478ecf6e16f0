"""The reader for Ascend reliability and network telemetry: runs ``npu-smi info -t ecc|health|usages`` and
``hccn_tool -i N -<query> -g`` for every chip, through the tool runner, and keeps the last good answer of
each call.

Each call has a hard timeout and its process group is killed (toolrun). A tool stuck in the driver usually
stays stuck for every device, so after one timeout the sweep skips that tool's remaining calls (counted as
``skipped``) instead of paying the timeout once per chip. A failed call keeps serving its previous answer
for ``stale_after_s`` and then drops it: an old link state is not reported as the current one. Errors are
counted per query in CollectorHealth (collector ``hccn_tool:link``, ``npu-smi:ecc``, ...).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.sources.hccn.parse import PARSERS
from npudist.telemetry.sources.measurements import ChipMeasurements, Measurement
from npudist.telemetry.sources.npu_smi.reliability import parse_ecc, parse_health, parse_usages
from npudist.telemetry.sources.npu_smi.source import NpuSmiSource
from npudist.telemetry.sources.readings import ParseError, Source, SourceError
from npudist.telemetry.sources.tool_call import call_tool

log = logging.getLogger("npudist.telemetry")

HCCN_TOOL_DRIVER_PATH = "/usr/local/Ascend/driver/tools/hccn_tool"
"""Where the Ascend driver installs hccn_tool (MindCluster's hccn_tool.go runs it from there)."""


@dataclass(frozen=True)
class Chip:
    npu: int
    """npu-smi NPU ID (the ``device`` label)."""
    chip: int
    logical: int
    """Chip Logic ID; hccn_tool's ``-i`` (the NIC) on hosts where, as on bare 910/910B servers, the physical
    and logical IDs coincide."""


@dataclass(frozen=True)
class Query:
    name: str
    """Collector name a site switches off (``--collectors -optical``)."""
    tool: str
    """npu-smi or hccn_tool."""
    per: str
    """npu: one call per card (the output lists its chips); chip: per chip; nic: per chip's NIC."""
    args: Callable[[Chip], list[str]]
    parse: Callable[[str], list[Measurement]]
    families: tuple[str, ...]
    """Catalogue families the query produces (a query whose families are all switched off is not run)."""


def _hccn(query: str) -> Callable[[Chip], list[str]]:
    return lambda c: ["-i", str(c.logical), f"-{query}", "-g"]


_HBM = ("npudist_device_ecc_corrected_errors_total", "npudist_device_ecc_uncorrected_errors_total",
        "npudist_device_ecc_aggregate_corrected_errors_total", "npudist_device_ecc_aggregate_uncorrected_errors_total",
        "npudist_device_memory_retired_pages", "npudist_device_memory_pending_retirement_pages")
_STAT = ("npudist_link_pause_frames_total", "npudist_link_pfc_frames_total", "npudist_link_pfc_priority_frames_total",
         "npudist_link_mac_packets_total", "npudist_link_mac_bytes_total", "npudist_link_mac_bad_packets_total",
         "npudist_link_mac_bad_bytes_total", "npudist_link_mac_fcs_errors_total", "npudist_link_roce_packets_total",
         "npudist_link_roce_rc_packets_total", "npudist_link_roce_error_packets_total",
         "npudist_link_roce_cnp_packets_total", "npudist_link_roce_completions_total",
         "npudist_link_roce_retransmits_total", "npudist_link_roce_ecn_marked_packets_total",
         "npudist_link_roce_verification_errors_total", "npudist_link_roce_unexpected_acks_total",
         "npudist_link_roce_out_of_order_packets_total", "npudist_link_roce_qp_status_errors_total",
         "npudist_link_nic_packets_total", "npudist_link_nic_bytes_total")
_OPTICAL = ("npudist_link_optical_present", "npudist_link_optical_temperature_celsius",
            "npudist_link_optical_supply_voltage_volts", "npudist_link_optical_tx_power_watts",
            "npudist_link_optical_rx_power_watts", "npudist_link_optical_tx_bias_amperes",
            "npudist_link_optical_media_snr_decibels", "npudist_link_optical_host_snr_decibels",
            "npudist_link_optical_signal_lost", "npudist_link_optical_lock_lost",
            "npudist_link_optical_temperature_limit_celsius", "npudist_link_optical_supply_voltage_limit_volts",
            "npudist_link_optical_tx_power_limit_watts", "npudist_link_optical_rx_power_limit_watts")

NPU_SMI_QUERIES: tuple[Query, ...] = (
    Query("ecc", "npu-smi", "npu", lambda c: ["info", "-t", "ecc", "-i", str(c.npu)], parse_ecc, _HBM),
    Query("health", "npu-smi", "chip", lambda c: ["info", "-t", "health", "-i", str(c.npu), "-c", str(c.chip)],
          parse_health, ("npudist_device_alarm_level", "npudist_device_error_codes",
                         "npudist_device_error_code_info")),
    Query("usages", "npu-smi", "npu", lambda c: ["info", "-t", "usages", "-i", str(c.npu)], parse_usages,
          ("npudist_device_aivector_utilization_ratio", "npudist_device_aicube_utilization_ratio",
           "npudist_device_aicpu_utilization_ratio", "npudist_device_ctrlcpu_utilization_ratio",
           "npudist_device_overall_utilization_ratio", "npudist_device_hbm_bandwidth_utilization_ratio",
           "npudist_device_ddr_bandwidth_utilization_ratio")),
)
HCCN_QUERIES: tuple[Query, ...] = (
    Query("link", "hccn_tool", "nic", _hccn("link"), PARSERS["link"], ("npudist_link_up",)),
    Query("link_stat", "hccn_tool", "nic", _hccn("link_stat"), PARSERS["link_stat"],
          ("npudist_link_up_events_total", "npudist_link_down_events_total")),
    Query("stat", "hccn_tool", "nic", _hccn("stat"), PARSERS["stat"], _STAT),
    Query("optical", "hccn_tool", "nic", _hccn("optical"), PARSERS["optical"], _OPTICAL),
    Query("net_health", "hccn_tool", "nic", _hccn("net_health"), PARSERS["net_health"],
          ("npudist_link_net_healthy", "npudist_link_net_health_info")),
    Query("speed", "hccn_tool", "nic", _hccn("speed"), PARSERS["speed"], ("npudist_link_speed_bytes_per_second",)),
    Query("ip", "hccn_tool", "nic", _hccn("ip"), PARSERS["ip"], ("npudist_link_info",)),
)
QUERIES: tuple[Query, ...] = NPU_SMI_QUERIES + HCCN_QUERIES


def hccn_tool_binary() -> str:
    """hccn_tool on PATH, else the driver's copy, else the bare name (the first call then fails as missing)."""
    found = shutil.which("hccn_tool")
    if found:
        return found
    return HCCN_TOOL_DRIVER_PATH if os.access(HCCN_TOOL_DRIVER_PATH, os.X_OK) else "hccn_tool"


def _targets(query: Query, chips: Iterable[Chip]) -> list[Chip]:
    if query.per != "npu":
        return list(chips)
    first: dict[int, Chip] = {}
    for c in sorted(chips, key=lambda c: (c.npu, c.chip)):
        first.setdefault(c.npu, c)
    return list(first.values())


class AscendSweep(Source):
    """One sweep runs ``queries`` for every chip ``npu-smi info -m`` lists; read() returns ChipMeasurements."""

    vendor = "npu"

    def __init__(self, queries: Sequence[Query], health: CollectorHealth, *, name: str,
                 npu_smi: str = "npu-smi", hccn_tool: str | None = None, timeout: float = 5.0,
                 stale_after_s: float = 120.0, chips: Sequence[Chip] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.queries = tuple(queries)
        self.health = health
        self.binaries = {"npu-smi": npu_smi, "hccn_tool": hccn_tool or hccn_tool_binary()}
        self.timeout = timeout
        self.stale_after_s = stale_after_s
        self.clock = clock
        self._chips = list(chips) if chips is not None else None
        self._npu_smi = NpuSmiSource(npu_smi, timeout)
        self._last: dict[tuple[str, Chip], tuple[float, list[Measurement]]] = {}
        self._lock = threading.Lock()

    def chips(self) -> list[Chip]:
        """Every AI chip of the node, from ``npu-smi info -m`` (read once; it is fixed while the driver runs)."""
        if self._chips is None:
            mapping = self._npu_smi.logical_ids()
            self._chips = sorted((Chip(npu, chip, logical) for (npu, chip), logical in mapping.items()),
                                 key=lambda c: c.logical)
        return self._chips

    def read(self) -> list[ChipMeasurements]:
        chips = self.chips()  # SourceError when npu-smi cannot list the chips: the poller counts it
        hung: set[str] = set()
        for query in self.queries:
            collector = f"{query.tool}:{query.name}"
            for chip in _targets(query, chips):
                if query.tool in hung:
                    self.health.error(collector, "skipped")
                    continue
                began = time.monotonic()
                try:
                    text = call_tool(self.binaries[query.tool], query.args(chip), self.timeout,
                                     "install the Ascend driver, which ships it")
                    found = query.parse(text)
                except SourceError as exc:
                    hung.update([query.tool] if exc.reason == "timeout" else [])
                    self.health.error(collector, exc.reason, time.monotonic() - began)
                    log.debug("%s on chip %s: %s", collector, chip, exc)
                    continue
                except ParseError as exc:
                    self.health.error(collector, "parse", time.monotonic() - began)
                    log.debug("%s on chip %s: %s", collector, chip, exc)
                    continue
                with self._lock:
                    self._last[(query.name, chip)] = (self.clock(), found)
                self.health.success(collector, time.monotonic() - began)
        return self._assemble(chips, self.clock())

    def _assemble(self, chips: list[Chip], now: float) -> list[ChipMeasurements]:
        by_npu = {c.npu: sorted((x for x in chips if x.npu == c.npu), key=lambda x: x.chip) for c in chips}
        grouped: dict[tuple[int, int, str], list[Measurement]] = {}
        with self._lock:
            for (name, chip), (when, found) in list(self._last.items()):
                if now - when > self.stale_after_s:
                    del self._last[(name, chip)]
                    continue
                query = next(q for q in self.queries if q.name == name)
                for x in found:
                    target = chip
                    if x.chip_id is not None and x.chip_id != chip.chip:
                        target = next((c for c in by_npu[chip.npu] if c.chip == x.chip_id), None)
                        if target is None:
                            continue  # a chip `info -m` does not list (the MCU, a corrupt ID)
                    nic = str(target.logical) if query.per == "nic" else ""
                    grouped.setdefault((target.npu, target.chip, nic), []).append(x)
        return [ChipMeasurements(self.vendor, npu, chip, nic, tuple(found))
                for (npu, chip, nic), found in sorted(grouped.items())]


def ascend_sweeps(health: CollectorHealth, enabled: Callable[[Query], bool], *, timeout: float = 5.0,
                  npu_smi: str = "npu-smi", hccn_tool: str | None = None) -> list[AscendSweep]:
    """The npu-smi and hccn_tool sweeps with the enabled queries (separate, so a hung hccn_tool never delays
    the ECC and alarm reads); a sweep with no query left is not built."""
    sweeps = []
    for name, queries in (("npu-smi-reliability", NPU_SMI_QUERIES), ("hccn_tool", HCCN_QUERIES)):
        chosen = [q for q in queries if enabled(q)]
        if chosen:
            sweeps.append(AscendSweep(chosen, health, name=name, npu_smi=npu_smi, hccn_tool=hccn_tool,
                                      timeout=timeout))
    return sweeps
