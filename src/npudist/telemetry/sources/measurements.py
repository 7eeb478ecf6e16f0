"""Records of the reliability and network sources: one value of one catalogue family, already in base units.

The basic device metrics fit one fixed record (DeviceReading); ECC, alarms, link and optical readings do not:
how many there are depends on the card (lanes, PFC priorities, error codes). Parsers therefore return
Measurements named by their catalogue family with only the labels the row adds (``lane``, ``priority``,
``memory``); the reader attaches which chip and NIC they belong to, and the collector builds the families.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measurement:
    metric: str
    """A catalogue family name (npudist_device_... or npudist_link_...)."""
    value: float
    labels: tuple[tuple[str, str], ...] = ()
    """The family's own labels beyond the device (and NIC) labels, as (name, value) pairs."""
    chip_id: int | None = None
    """The chip a multi-chip output printed for this value (``Chip ID``); None: the chip that was asked for."""


@dataclass(frozen=True)
class ChipMeasurements:
    """Everything one sweep read for one chip (and its NIC, for the link families)."""

    vendor: str
    device_id: int
    """The vendor tool's card label (npu-smi NPU ID, NVML index), as on DeviceReading and the ``device`` label."""
    chip_id: int
    nic: str
    """The NIC the link families describe: hccn_tool's ``-i`` device (as in /etc/hccn.conf ``address_N``);
    empty for chip-only values."""
    measurements: tuple[Measurement, ...]


def m(metric: str, value: float | None, **labels: str) -> list[Measurement]:
    """[Measurement] or [] when the printed value was not usable (None never becomes 0)."""
    return [] if value is None else [Measurement(metric, float(value), tuple(labels.items()))]
