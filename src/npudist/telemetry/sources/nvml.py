"""NVIDIA GPUs through NVML (``pynvml`` from the nvidia-ml-py package), imported only when read.

Units, from the NVML API reference (docs.nvidia.com/deploy/nvml-api): nvmlDeviceGetPowerUsage ->
milliwatts; nvmlDeviceGetMemoryInfo -> bytes (.used, .total); nvmlDeviceGetUtilizationRates -> percent
(.gpu); nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU) -> degrees C; nvmlDeviceGetClockInfo(NVML_CLOCK_SM)
-> MHz. A call a GPU does not support raises NVMLError (NOT_SUPPORTED): that field is None.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from npudist.telemetry.sources import _values as v
from npudist.telemetry.sources.readings import DeviceReading, Source, SourceError


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):  # older pynvml returns bytes
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value.strip() else None


def _number(value: Any) -> float | None:
    return v.number(str(value)) if isinstance(value, int | float) and not isinstance(value, bool) else None


def start_nvml(nvml: ModuleType | None) -> ModuleType:
    """``nvml`` (or pynvml, imported now) after nvmlInit; SourceError ``missing`` when either fails. NVML
    counts its inits, so every source starts (and may shut down) its own."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            raise SourceError("missing", "Python package 'pynvml' is not installed: "
                              "pip install nvidia-ml-py (or npudist[nvidia])") from None
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError: driver not loaded / library not found
        raise SourceError("missing", f"NVML could not start (is the NVIDIA driver loaded?): {exc}") from None
    return nvml


class NvmlSource(Source):
    """One reading per GPU NVML sees; ``nvml`` injects a module (tests pass a fake pynvml)."""

    name = "nvml"
    vendor = "cuda"

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._initialised = False

    def _module(self) -> ModuleType:
        if not self._initialised:
            self._nvml = start_nvml(self._nvml)
            self._initialised = True
        return self._nvml  # type: ignore[return-value]

    def read(self) -> list[DeviceReading]:
        nvml = self._module()
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            raise SourceError("error", f"nvmlDeviceGetCount failed: {exc}") from None
        readings = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception:
                continue  # a GPU that fell off the bus; the others still report
            readings.append(self._reading(nvml, index, handle))
        return readings

    def _reading(self, nvml: ModuleType, index: int, handle: Any) -> DeviceReading:
        def get(call: Callable[[], Any]) -> Any:
            try:
                return call()
            except Exception:  # NVMLError_NotSupported and friends: field not available
                return None

        memory = get(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        util = get(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        power_mw = _number(get(lambda: nvml.nvmlDeviceGetPowerUsage(handle)))
        clock_mhz = _number(get(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
        pci = get(lambda: nvml.nvmlDeviceGetPciInfo(handle))
        used = getattr(memory, "used", None)
        total = getattr(memory, "total", None)
        gpu_pct = _number(getattr(util, "gpu", None))
        return DeviceReading(
            vendor=self.vendor,
            device_id=index,
            name=_text(get(lambda: nvml.nvmlDeviceGetName(handle))),
            power_watts=power_mw / 1000.0 if power_mw is not None and power_mw >= 0 else None,
            temperature_celsius=_number(get(lambda: nvml.nvmlDeviceGetTemperature(
                handle, nvml.NVML_TEMPERATURE_GPU))),
            utilization_ratio=v.ratio_from_percent(str(gpu_pct)) if gpu_pct is not None else None,
            frequency_hertz=clock_mhz * 1e6 if clock_mhz is not None and clock_mhz >= 0 else None,
            memory_used_bytes=used if isinstance(used, int) and 0 <= used < 2**63 else None,
            memory_total_bytes=total if isinstance(total, int) and 0 < total < 2**63 else None,
            bus_id=_text(getattr(pci, "busId", None)),
        )

    def close(self) -> None:
        """Release NVML (nvmlShutdown) if this source started it."""
        if self._initialised and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            finally:
                self._initialised = False
