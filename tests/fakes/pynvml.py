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


GPUS: list[FakeGpu] = []
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
