"""Combining partial readings of the same chip (several ``npu-smi info -t`` queries, a table and a map)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from npudist.telemetry.sources.readings import DeviceReading

_KEY_FIELDS = ("vendor", "device_id", "chip_id")


def merge_readings(*groups: Iterable[DeviceReading]) -> list[DeviceReading]:
    """One reading per (vendor, device_id, chip_id), first-seen order; per field the first non-None wins."""
    merged: dict[tuple[str, int, int], DeviceReading] = {}
    for group in groups:
        for reading in group:
            key = (reading.vendor, reading.device_id, reading.chip_id)
            old = merged.get(key)
            if old is None:
                merged[key] = reading
                continue
            fill = {f.name: getattr(reading, f.name) for f in dataclasses.fields(DeviceReading)
                    if f.name not in _KEY_FIELDS and getattr(old, f.name) is None}
            merged[key] = dataclasses.replace(old, **fill)
    return list(merged.values())
