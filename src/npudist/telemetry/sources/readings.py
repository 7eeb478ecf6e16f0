"""What every device source produces: plain records in Prometheus base units.

Parsers convert vendor units (MiB, milliwatts, millidegrees, MHz, percent) once, when they build
these records; nothing downstream converts again. None means the source printed nothing usable
for that field: it is never exported as 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


class ParseError(ValueError):
    """Vendor text holds no readable device data; the message says what was expected."""


@dataclass(frozen=True)
class DeviceReading:
    vendor: str
    """Vendor row name: npu, cuda, mlu, rknpu, cpu."""
    device_id: int
    """The vendor tool's label for the card (npu-smi "NPU" column, NVML index): a label, not an index."""
    chip_id: int = 0
    """Chip within the card (310P Duo and A3 cards have two), or the NPU core on RK3588."""
    name: str | None = None
    health: str | None = None
    """OK, Warning, Alarm, Critical or UNKNOWN as printed by the vendor tool."""
    power_watts: float | None = None
    temperature_celsius: float | None = None
    utilization_ratio: float | None = None
    """AI-core (or SM) busy fraction, 0-1."""
    frequency_hertz: float | None = None
    memory_used_bytes: int | None = None
    """The device's main memory: HBM where the card has it, else DDR."""
    memory_total_bytes: int | None = None
    hbm_used_bytes: int | None = None
    hbm_total_bytes: int | None = None
    ddr_used_bytes: int | None = None
    ddr_total_bytes: int | None = None
    bus_id: str | None = None
    logical_id: int | None = None
    """Index torch and the visible-devices variable use (npu-smi "Chip Logic ID"), when known."""


@dataclass(frozen=True)
class ProcessReading:
    """A process holding a device, from the vendor tool's process table."""

    vendor: str
    device_id: int
    chip_id: int
    pid: int
    name: str | None = None
    memory_used_bytes: int | None = None


@dataclass(frozen=True)
class RankDevice:
    """The physical device a rank computes on, as the device metrics label it."""

    device_id: int
    """The vendor tool's label for the card (npu-smi NPU ID), as on DeviceReading and the ``device`` label."""
    chip_id: int
    logical_id: int
    """The index the vendor runtime and its visible-devices variable use (npu-smi Chip Logic ID)."""


class SourceError(RuntimeError):
    """A device source could not produce readings this time (the poller counts it and carries on)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        """Short label for npudist_collector_errors_total{reason}: timeout, too_large, exit_code, parse, missing,
        error."""


class Source:
    """A device source: ``read()`` may block or raise SourceError; callers run it off the scrape path."""

    name: str = "source"
    vendor: str = "cpu"

    def read(self) -> list[DeviceReading]:  # pragma: no cover - interface
        raise NotImplementedError

    def locate(self, env: Mapping[str, str], device_index: int) -> RankDevice | None:
        """The device behind the vendor runtime's device ``device_index`` in a process with environment
        ``env`` (visible-devices variables remap indices); None where the source cannot tell. May raise
        SourceError, or ValueError for a variable that names no device here."""
        return None
