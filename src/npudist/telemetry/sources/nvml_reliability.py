"""NVIDIA reliability through NVML (``pynvml`` of nvidia-ml-py): ECC, retired pages, remapped rows, XID
errors and clock-throttle reasons, in the families the Ascend sweep fills (same names, ``memory``/``cause``
labels), so one alert covers both vendors.

NVML facts (NVML API reference, docs.nvidia.com/deploy/nvml-api; names as in nvidia-ml-py's pynvml.py):
- nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_CORRECTED|UNCORRECTED, NVML_VOLATILE_ECC|
  NVML_AGGREGATE_ECC): volatile counts reset with the driver, aggregate ones persist;
- nvmlDeviceGetRetiredPages(h, NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS|..._DOUBLE_BIT_ECC_ERROR)
  lists page addresses (pre-A100), nvmlDeviceGetRetiredPagesPendingStatus -> NVML_FEATURE_ENABLED when a reset
  is due; nvmlDeviceGetRemappedRows -> (corrected rows, uncorrected rows, pending, failed) on A100 and later;
- nvmlDeviceGetCurrentClocksEventReasons (the older name ...ClocksThrottleReasons) is a bit mask of
  nvmlClocksEventReason* (nvmlClocksThrottleReason*) values;
- XID errors arrive as events: nvmlDeviceRegisterEvents(h, nvmlEventTypeXidCriticalError, set), then
  nvmlEventSetWait_v2(set, 0) returns one event (eventData = the XID) or raises NVMLError NVML_ERROR_TIMEOUT.
A call the GPU does not support raises NVMLError (NOT_SUPPORTED): that family has no sample for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType, ModuleType
from typing import Any

from npudist.telemetry.sources.measurements import ChipMeasurements, Measurement, m
from npudist.telemetry.sources.nvml import start_nvml
from npudist.telemetry.sources.readings import Source, SourceError

NVML_COLLECTORS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "nvml_ecc": ("npudist_device_ecc_corrected_errors_total", "npudist_device_ecc_uncorrected_errors_total",
                 "npudist_device_ecc_aggregate_corrected_errors_total",
                 "npudist_device_ecc_aggregate_uncorrected_errors_total"),
    "nvml_pages": ("npudist_device_memory_retired_pages", "npudist_device_memory_retirement_pending",
                   "npudist_device_memory_remapped_rows", "npudist_device_memory_remap_pending",
                   "npudist_device_memory_remap_failed"),
    "nvml_xid": ("npudist_device_xid_errors_total",),
    "nvml_throttle": ("npudist_device_clock_throttle_active",),
})
"""Collector name -> families; all on by default (dcgm-exporter ships ECC and XID commented out)."""

THROTTLE_REASONS: Mapping[str, str] = MappingProxyType({
    # reason label -> pynvml constant suffix (nvmlClocksEventReason<X>, older nvmlClocksThrottleReason<X>)
    "gpu_idle": "GpuIdle", "applications_clocks_setting": "ApplicationsClocksSetting",
    "sw_power_cap": "SwPowerCap", "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost",
    "sw_thermal_slowdown": "SwThermalSlowdown", "hw_thermal_slowdown": "HwThermalSlowdown",
    "hw_power_brake_slowdown": "HwPowerBrakeSlowdown", "display_clock_setting": "DisplayClockSetting",
})
API_NAMES = (
    "nvmlInit", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetTotalEccErrors",
    "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC",
    "NVML_AGGREGATE_ECC", "nvmlDeviceGetRetiredPages", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
    "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", "nvmlDeviceGetRetiredPagesPendingStatus",
    "NVML_FEATURE_ENABLED", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventTypeXidCriticalError", "nvmlEventSetWait_v2",
    "NVML_ERROR_TIMEOUT", "NVMLError", "nvmlDeviceGetIndex",
    *(f"nvmlClocksThrottleReason{x}" for x in THROTTLE_REASONS.values()),
)
"""Every pynvml name this module uses; tests/vendor checks them against the released nvidia-ml-py."""
MAX_EVENTS_PER_READ = 1000
"""XID events drained per read at most (a storm must not hold the poller)."""


class NvmlReliabilitySource(Source):
    """Reliability families per GPU; ``nvml`` injects a module (tests pass the fake pynvml)."""

    name = "nvml-reliability"
    vendor = "cuda"

    def __init__(self, nvml: ModuleType | None = None, selection: Any = None) -> None:
        self._nvml = nvml
        self._started = False
        self._events: Any = None
        self._xids: dict[tuple[int, int], int] = {}
        self.collectors = [c for c, fams in NVML_COLLECTORS.items()
                           if selection is None or selection.any_on(fams)]

    def _module(self) -> ModuleType:
        if not self._started:
            self._nvml = start_nvml(self._nvml)
            self._started = True
        return self._nvml  # type: ignore[return-value]

    def read(self) -> list[ChipMeasurements]:
        nvml = self._module()
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]
        except Exception as exc:
            raise SourceError("error", f"NVML device enumeration failed: {exc}") from None
        if "nvml_xid" in self.collectors:
            self._drain_xids(nvml, handles)
        out = []
        for index, handle in enumerate(handles):
            found: list[Measurement] = []
            for collector in self.collectors:
                found += _READERS[collector](self, nvml, index, handle)
            out.append(ChipMeasurements(self.vendor, index, 0, "", tuple(found)))
        return out

    def _drain_xids(self, nvml: ModuleType, handles: list[Any]) -> None:
        if self._events is None:
            try:
                self._events = nvml.nvmlEventSetCreate()
                for h in handles:
                    try:
                        nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, self._events)
                    except Exception:  # a GPU without event support: the others still report
                        continue
            except Exception:
                self._events = False
        if not self._events:
            return
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: no event waiting
                return
            index = _count(_get(lambda e=event: nvml.nvmlDeviceGetIndex(e.device)))
            if index is not None:
                key = (index, int(event.eventData))
                self._xids[key] = self._xids.get(key, 0) + 1

    def _xid(self, nvml: ModuleType, index: int, handle: Any) -> list[Measurement]:
        return [x for (i, xid), n in sorted(self._xids.items()) if i == index
                for x in m("npudist_device_xid_errors_total", n, xid=str(xid))]


def _get(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:  # NVMLError_NotSupported and friends: no sample
        return None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63 else None


def _ecc(src: NvmlReliabilitySource, nvml: ModuleType, index: int, h: Any) -> list[Measurement]:
    out: list[Measurement] = []
    for kind, family in (("CORRECTED", "corrected"), ("UNCORRECTED", "uncorrected")):
        error_type = getattr(nvml, f"NVML_MEMORY_ERROR_TYPE_{kind}")
        for counter, prefix in ((nvml.NVML_VOLATILE_ECC, ""), (nvml.NVML_AGGREGATE_ECC, "aggregate_")):
            value = _count(_get(lambda t=error_type, c=counter: nvml.nvmlDeviceGetTotalEccErrors(h, t, c)))
            out += m(f"npudist_device_ecc_{prefix}{family}_errors_total", value, memory="device")
    return out


def _pages(src: NvmlReliabilitySource, nvml: ModuleType, index: int, h: Any) -> list[Measurement]:
    out: list[Measurement] = []
    for cause, const in (("single_bit", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
                         ("double_bit", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR")):
        pages = _get(lambda c=const: nvml.nvmlDeviceGetRetiredPages(h, getattr(nvml, c)))
        out += m("npudist_device_memory_retired_pages", len(pages) if isinstance(pages, list) else None,
                 memory="device", cause=cause)
    pending = _get(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h))
    out += m("npudist_device_memory_retirement_pending",
             None if _count(pending) is None else int(pending == nvml.NVML_FEATURE_ENABLED))
    rows = _get(lambda: nvml.nvmlDeviceGetRemappedRows(h))
    if isinstance(rows, tuple) and len(rows) == 4 and all(_count(x) is not None for x in rows):
        corrected, uncorrected, pending_rows, failed = rows
        out += m("npudist_device_memory_remapped_rows", corrected, cause="correctable")
        out += m("npudist_device_memory_remapped_rows", uncorrected, cause="uncorrectable")
        out += m("npudist_device_memory_remap_pending", int(bool(pending_rows)))
        out += m("npudist_device_memory_remap_failed", int(bool(failed)))
    return out


def _throttle(src: NvmlReliabilitySource, nvml: ModuleType, index: int, h: Any) -> list[Measurement]:
    get = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
           or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
    mask = _count(_get(lambda: get(h)))
    if mask is None:
        return []
    out: list[Measurement] = []
    for reason, suffix in THROTTLE_REASONS.items():
        bit = getattr(nvml, f"nvmlClocksThrottleReason{suffix}", None)
        if isinstance(bit, int):
            out += m("npudist_device_clock_throttle_active", int(bool(mask & bit)), reason=reason)
    return out


_READERS: Mapping[str, Callable[[NvmlReliabilitySource, ModuleType, int, Any], list[Measurement]]] = \
    MappingProxyType({"nvml_ecc": _ecc, "nvml_pages": _pages, "nvml_xid": NvmlReliabilitySource._xid,
                      "nvml_throttle": _throttle})
