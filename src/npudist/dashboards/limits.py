"""Device temperature limits per vendor, for the "device too hot" alert.

The alert fires a few degrees before the hardware protects itself (clock or power reduction), so there
is time to act. Each limit cites where it comes from; rows marked ``assumed`` have no public vendor
figure we could read and should be set per site (``npudist dashboards export`` writes them into the rules).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TemperatureLimit:
    vendor: str
    """The ``vendor`` label of npudist_device_* (accelerator row name)."""
    celsius: float
    source: str
    assumed: bool = False


LIMITS: tuple[TemperatureLimit, ...] = (
    # Cambricon MLU290-M5 product manual, 4.3.4.2 "THERMTRIP# overtemperature alarm signal": fan to full
    # speed below 93 C, power halved at 97 C, shutdown at 100 C.
    TemperatureLimit("mlu", 93.0, "Cambricon MLU290-M5 product manual 4.3.4.2 (power reduction from 97 C)"),
    # Rockchip kernel device trees put the passive "target" trip of the SoC thermal zone at 85000
    # millicelsius (e.g. rk3308.dtsi thermal-zones/soc-thermal); the cooling maps throttle from there.
    TemperatureLimit("rknpu", 85.0, "Rockchip device-tree soc-thermal passive trip 85 C (throttling)"),
    # No public Ascend figure read for this project: npu-smi's own Warning/Alarm health covers the
    # vendor's thresholds (NpudistDeviceUnhealthy); this is an early warning only.
    TemperatureLimit("npu", 85.0, "assumed early-warning value; npu-smi health carries Huawei's own limits",
                     assumed=True),
    # NVIDIA's slowdown temperature is per board (NVML_TEMPERATURE_THRESHOLD_SLOWDOWN), not per vendor.
    TemperatureLimit("cuda", 85.0, "assumed; read your board's slowdown threshold with nvidia-smi -q -d TEMPERATURE",
                     assumed=True),
    TemperatureLimit("cpu", 90.0, "assumed; x86 server CPUs throttle at about 95-100 C (TjMax)", assumed=True),
)


def over_limit_expr(limits: tuple[TemperatureLimit, ...] = LIMITS) -> str:
    """One PromQL expression: every device hotter than its vendor's limit (value = its temperature)."""
    parts = [f'npudist_device_temperature_celsius{{vendor="{lim.vendor}"}} > {lim.celsius:g}' for lim in limits]
    return "\n  or ".join(f"({p})" for p in parts)
