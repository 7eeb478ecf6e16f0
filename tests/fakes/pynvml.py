"""Fake ``pynvml`` (nvidia-ml-py) for NvmlSource tests: just the calls npudist makes, with NVML's units.

Faked from the NVML API reference (docs.nvidia.com/deploy/nvml-api, "Device Queries") and nvidia-ml-py's
pynvml.py names:
  nvmlInit / nvmlShutdown
  nvmlDeviceGetCount() -> int
  nvmlDeviceGetHandleByIndex(i) -> handle
  nvmlDeviceGetName(h) -> str (bytes in pynvml < 11.5.0; set FakeGpu.name to bytes to fake that)
  nvmlDeviceGetPowerUsage(h) -> int milliwatts
  nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU) -> int degrees C
  nvmlDeviceGetUtilizationRates(h) -> struct with .gpu and .memory, percent
  nvmlDeviceGetMemoryInfo(h) -> struct with .total, .free, .used, bytes
  nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM) -> int MHz
  nvmlDeviceGetPciInfo(h) -> struct with .busId (str, or bytes in older pynvml)
Reliability (nvml_reliability.py), constants with nvidia-ml-py's values:
  nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_*, NVML_VOLATILE_ECC|NVML_AGGREGATE_ECC) -> int
  nvmlDeviceGetRetiredPages(h, NVML_PAGE_RETIREMENT_CAUSE_*) -> list of page addresses
  nvmlDeviceGetRetiredPagesPendingStatus(h) -> NVML_FEATURE_ENABLED|DISABLED
  nvmlDeviceGetRemappedRows(h) -> (corrected, uncorrected, pending, failed)
  nvmlDeviceGetCurrentClocksThrottleReasons(h) -> bit mask of nvmlClocksThrottleReason*
  nvmlEventSetCreate / nvmlDeviceRegisterEvents / nvmlEventSetWait_v2 (raises NVMLError(NVML_ERROR_TIMEOUT)
  when no event waits; tests append (gpu index, xid) to XID_EVENTS) / nvmlDeviceGetIndex
A value of None on a FakeGpu makes that call raise NVMLError(NVML_ERROR_NOT_SUPPORTED), as real GPUs do
for sensors they lack. Tests set ``GPUS`` (a list of FakeGpu) and ``INIT_ERROR`` directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED = 0, 1
NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 0, 1
nvmlEventTypeXidCriticalError = 0x8
nvmlClocksThrottleReasonGpuIdle = 0x1
nvmlClocksThrottleReasonApplicationsClocksSetting = 0x2
nvmlClocksThrottleReasonSwPowerCap = 0x4
nvmlClocksThrottleReasonHwSlowdown = 0x8
nvmlClocksThrottleReasonSyncBoost = 0x10
nvmlClocksThrottleReasonSwThermalSlowdown = 0x20
nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksThrottleReasonDisplayClockSetting = 0x100


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    name: Any = "NVIDIA H100 80GB HBM3"
    power_mw: Any = 250_500
    temperature_c: Any = 41
    util_gpu_pct: Any = 37
    memory_used: Any = 1_073_741_824
    memory_total: Any = 85_520_809_984
    sm_clock_mhz: Any = 1980
    bus_id: Any = "00000000:18:00.0"
    ecc: Any = ((3, 0), (120, 1))
    """((volatile corrected, volatile uncorrected), (aggregate corrected, aggregate uncorrected))."""
    retired_pages: Any = ((0x1000, 0x2000), (0x3000,))
    """(single-bit cause page addresses, double-bit cause page addresses)."""
    retirement_pending: Any = 0
    remapped_rows: Any = (2, 1, 1, 0)
    throttle_mask: Any = 0x4 | 0x40


GPUS: list[FakeGpu] = []
XID_EVENTS: list[tuple[int, int]] = []
INIT_ERROR: int | None = None
_state = {"initialised": False}


def nvmlInit() -> None:
    if INIT_ERROR is not None:
        raise NVMLError(INIT_ERROR)
    _state["initialised"] = True


def nvmlShutdown() -> None:
    _state["initialised"] = False


def _check() -> None:
    if not _state["initialised"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _value(v: Any) -> Any:
    if v is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return v


def nvmlDeviceGetCount() -> int:
    _check()
    return len(GPUS)


def nvmlDeviceGetHandleByIndex(index: int) -> FakeGpu:
    _check()
    return GPUS[index]


def nvmlDeviceGetName(h: FakeGpu) -> Any:
    return _value(h.name)


def nvmlDeviceGetPowerUsage(h: FakeGpu) -> int:
    return _value(h.power_mw)


def nvmlDeviceGetTemperature(h: FakeGpu, sensor: int) -> int:
    assert sensor == NVML_TEMPERATURE_GPU
    return _value(h.temperature_c)


def nvmlDeviceGetUtilizationRates(h: FakeGpu) -> SimpleNamespace:
    return SimpleNamespace(gpu=_value(h.util_gpu_pct), memory=0)


def nvmlDeviceGetMemoryInfo(h: FakeGpu) -> SimpleNamespace:
    used, total = _value(h.memory_used), _value(h.memory_total)
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetClockInfo(h: FakeGpu, clock: int) -> int:
    assert clock == NVML_CLOCK_SM
    return _value(h.sm_clock_mhz)


def nvmlDeviceGetPciInfo(h: FakeGpu) -> SimpleNamespace:
    return SimpleNamespace(busId=_value(h.bus_id))


def nvmlDeviceGetIndex(h: FakeGpu) -> int:
    return next(i for i, g in enumerate(GPUS) if g is h)  # FakeGpus with equal fields are equal


def nvmlDeviceGetTotalEccErrors(h: FakeGpu, error_type: int, counter_type: int) -> int:
    return _value(h.ecc)[counter_type][error_type]


def nvmlDeviceGetRetiredPages(h: FakeGpu, cause: int) -> list[int]:
    return list(_value(h.retired_pages)[cause])


def nvmlDeviceGetRetiredPagesPendingStatus(h: FakeGpu) -> int:
    return _value(h.retirement_pending)


def nvmlDeviceGetRemappedRows(h: FakeGpu) -> tuple[int, int, int, int]:
    return tuple(_value(h.remapped_rows))


def nvmlDeviceGetCurrentClocksThrottleReasons(h: FakeGpu) -> int:
    return _value(h.throttle_mask)


def nvmlEventSetCreate() -> object:
    _check()
    return object()


def nvmlDeviceRegisterEvents(h: FakeGpu, event_types: int, event_set: object) -> None:
    assert event_types == nvmlEventTypeXidCriticalError


def nvmlEventSetWait_v2(event_set: object, timeout_ms: int) -> SimpleNamespace:
    if not XID_EVENTS:
        raise NVMLError(NVML_ERROR_TIMEOUT)
    index, xid = XID_EVENTS.pop(0)
    return SimpleNamespace(device=GPUS[index], eventType=nvmlEventTypeXidCriticalError, eventData=xid)
