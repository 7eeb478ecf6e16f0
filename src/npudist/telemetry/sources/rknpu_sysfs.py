"""Rockchip NPU (RK3588 and kin): parsers for the rknpu driver's files and a reader over a sysfs root.

Two layouts are read (recordings in ``tests/fakes/rknpu/``, README there):
- Rockchip rknpu driver: debugfs ``sys/kernel/debug/rknpu/load`` (per-core load, root only, driver
  >= 0.7.2), ``.../rknpu/version``, devfreq ``sys/class/devfreq/<addr>.npu/{cur_freq,max_freq}`` (Hz;
  ``fdab0000.npu`` on RK3588, ``27700000.npu`` on RK3576), and thermal zones whose ``type`` names the NPU
  or SoC (``temp`` in millidegrees). RK3588 has no NPU power sensor.
- the generic ``sys/class/npu/npuN/device/{power_usage (mW), memory_usage (bytes), frequency (MHz)}``
  some vendor kernels and board support packages provide.

Every path is relative to ``root`` so tests use a temporary tree. A missing or unreadable file means
"not available" (None); only text that is present but unreadable makes a parser raise ParseError.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable
from typing import TypeVar

from npudist.telemetry.sources import _values as v
from npudist.telemetry.sources.readings import DeviceReading, ParseError, Source, SourceError

T = TypeVar("T")

LOAD_FILE = "sys/kernel/debug/rknpu/load"
VERSION_FILE = "sys/kernel/debug/rknpu/version"
DEVFREQ_GLOB = "sys/class/devfreq/*.npu"
THERMAL_GLOB = "sys/class/thermal/thermal_zone*"
GENERIC_GLOB = "sys/class/npu/npu*"
# Thermal zone types in order of preference: the NPU's own sensor, else the SoC's
# (RK3588 device tree: npu_thermal, soc_thermal, center_thermal, bigcore*, littlecore, gpu_thermal).
THERMAL_TYPES = ("npu", "soc", "center")


def parse_load(text: str) -> dict[str, float | None]:
    """``NPU load:  Core0: 12%, Core1:  0%,`` -> {"Core0": 0.12, "Core1": 0.0}; single-core boards print
    ``NPU load:  0%`` -> {"Core0": ...}. Blank or impossible values (a driver bug prints hundreds of
    thousands of percent) are None, never clamped. ParseError when the text is not a load line.
    """
    match = re.search(r"NPU\s+load\s*:(.*)", text, re.IGNORECASE)
    if not match:
        raise ParseError("not an rknpu load line: expected 'NPU load:  Core0: 12%, ...' or 'NPU load: 12%'")
    body = match.group(1)
    cores = re.findall(r"Core\s*(\d{1,4})\s*:\s*([^%,]*)%?", body, re.IGNORECASE)
    if cores:
        return {f"Core{int(n)}": v.ratio_from_percent(raw) for n, raw in cores}
    single = re.fullmatch(r"\s*([^%,]*)%\s*,?\s*", body)
    if single:
        return {"Core0": v.ratio_from_percent(single.group(1))}
    raise ParseError(f"rknpu load line has no 'CoreN: X%' or 'X%' value: {body.strip()[:80]!r}")


def parse_version(text: str) -> str:
    """``RKNPU driver: v0.9.6`` -> ``"0.9.6"``."""
    match = re.search(r"RKNPU\s+driver\s*:\s*v?(\d+(?:\.\d+)+)", text, re.IGNORECASE)
    if not match:
        raise ParseError("not an rknpu version line: expected 'RKNPU driver: v0.9.6'")
    return match.group(1)


def parse_int(text: str, what: str, signed: bool = False) -> int:
    """One integer per sysfs file (devfreq Hz, millidegrees, mW, bytes, MHz); only temperatures go below 0."""
    value = v.integer(text)
    if value is None or (value < 0 and not signed):
        raise ParseError(f"{what}: expected one {'' if signed else 'non-negative '}integer, "
                         f"got {text.strip()[:40]!r}")
    return value


def hertz(text: str) -> float:
    """devfreq ``cur_freq``/``max_freq``: already Hz."""
    return float(parse_int(text, "devfreq frequency (Hz)"))


def millicelsius(text: str) -> float:
    """thermal zone ``temp``: millidegrees Celsius."""
    return parse_int(text, "thermal zone temp (millidegrees C)", signed=True) / 1000.0


def milliwatts(text: str) -> float:
    return parse_int(text, "power_usage (mW)") / 1000.0


def memory_bytes(text: str) -> int:
    return parse_int(text, "memory_usage (bytes)")


def megahertz(text: str) -> float:
    return parse_int(text, "frequency (MHz)") * 1e6


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(4096)
    except OSError:  # missing, permission denied (debugfs is root-only), or gone since the glob
        return None


def _value(path: str, parser: Callable[[str], T]) -> T | None:
    """Parsed file content, or None when the file is missing, unreadable or malformed."""
    text = _read(path)
    if text is None:
        return None
    try:
        return parser(text)
    except ParseError:
        return None


class RknpuSource(Source):
    """Rockchip NPU readings from sysfs/debugfs under ``root`` (default: NPUDIST_SYSFS_ROOT or /)."""

    name = "rknpu"
    vendor = "rknpu"

    def __init__(self, root: str | None = None) -> None:
        if root is None:
            from npudist.accelerators.rknpu import sysfs_root

            root = sysfs_root()
        self.root = root

    def _path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def frequency_hertz(self) -> float | None:
        for dev in sorted(glob.glob(self._path(DEVFREQ_GLOB))):
            value = _value(os.path.join(dev, "cur_freq"), hertz)
            if value is not None:
                return value
        return None

    def max_frequency_hertz(self) -> float | None:
        for dev in sorted(glob.glob(self._path(DEVFREQ_GLOB))):
            value = _value(os.path.join(dev, "max_freq"), hertz)
            if value is not None:
                return value
        return None

    def temperature_celsius(self) -> float | None:
        zones: dict[str, str] = {}
        for zone in sorted(glob.glob(self._path(THERMAL_GLOB))):
            kind = (_read(os.path.join(zone, "type")) or "").strip().lower()
            zones.setdefault(kind, zone)
        for wanted in THERMAL_TYPES:
            for kind, zone in zones.items():
                if wanted in kind:
                    value = _value(os.path.join(zone, "temp"), millicelsius)
                    if value is not None:
                        return value
        return None

    def driver_version(self) -> str | None:
        return _value(self._path(VERSION_FILE), parse_version)

    def _generic(self) -> list[DeviceReading]:
        readings = []
        for dev in sorted(glob.glob(self._path(GENERIC_GLOB))):
            index = re.search(r"npu(\d+)$", dev)
            if index is None:
                continue
            base = os.path.join(dev, "device")
            readings.append(DeviceReading(
                vendor=self.vendor,
                device_id=int(index.group(1)),
                power_watts=_value(os.path.join(base, "power_usage"), milliwatts),
                memory_used_bytes=_value(os.path.join(base, "memory_usage"), memory_bytes),
                frequency_hertz=_value(os.path.join(base, "frequency"), megahertz),
            ))
        return sorted(readings, key=lambda r: r.device_id)

    def _rockchip(self) -> list[DeviceReading]:
        load = _value(self._path(LOAD_FILE), parse_load) or {}
        freq, temp = self.frequency_hertz(), self.temperature_celsius()
        present = bool(load) or freq is not None or os.path.exists(self._path("sys/kernel/debug/rknpu"))
        if not present:
            return []
        cores = sorted(load.items(), key=lambda kv: int(kv[0][4:])) or [("Core0", None)]
        return [DeviceReading(vendor=self.vendor, device_id=0, chip_id=int(core[4:]), name="rknpu",
                              utilization_ratio=util, frequency_hertz=freq, temperature_celsius=temp)
                for core, util in cores]

    def read(self) -> list[DeviceReading]:
        """One reading per npuN (generic layout), else one per NPU core (Rockchip driver files)."""
        readings = self._generic() or self._rockchip()
        if not readings:
            raise SourceError("missing", f"no Rockchip NPU under {self.root!r}: neither "
                              f"/{GENERIC_GLOB} nor /{LOAD_FILE} or /{DEVFREQ_GLOB} exists")
        return readings
