"""DeviceReadings from a JSON document with the record's own field names (already in base units).

For tools and wrappers that emit JSON instead of a table, and for users who pipe saved readings back
in. Accepts a list of objects or ``{"devices": [...]}``. Each object needs ``device_id`` (or its alias
``npu_id``); ``chip_id`` defaults to 0. A field of the wrong type or range is dropped (None), never
coerced, so a bad value cannot pass as a real 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from npudist.telemetry.sources import _values
from npudist.telemetry.sources.readings import DeviceReading, ParseError

_FLOATS = frozenset({"power_watts", "temperature_celsius", "utilization_ratio", "frequency_hertz"})
_INTS = frozenset({"memory_used_bytes", "memory_total_bytes", "hbm_used_bytes", "hbm_total_bytes",
         "ddr_used_bytes", "ddr_total_bytes", "logical_id"})
_STRS = frozenset({"name", "health", "bus_id"})
_NON_NEGATIVE = frozenset(_INTS | {"power_watts", "frequency_hertz"})


def _is_int(value: Any) -> bool:
    """An int64: JSON integers have no bound, and a 400-digit one cannot even be exported as a float."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _field(key: str, value: Any) -> Any:
    if key == "health":
        return _values.health(value) if isinstance(value, str) else None
    if key in _STRS:
        return value if isinstance(value, str) and value.strip() else None
    ok = _is_int(value) if key in _INTS else (_is_int(value) or isinstance(value, float)) and math.isfinite(value)
    if not ok or (key in _NON_NEGATIVE and value < 0):
        return None
    if key == "utilization_ratio" and not 0 <= value <= 1:
        return None
    return float(value) if key in _FLOATS else value


def parse_json(text: str, vendor: str) -> list[DeviceReading]:
    """Readings from a JSON document; ParseError if it is not JSON or holds no object with an ID."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"not a JSON document of device readings: {exc}") from None
    items = doc.get("devices") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise ParseError('JSON readings must be a list of objects or {"devices": [...]}')
    readings: list[DeviceReading] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        device_id = item.get("device_id", item.get("npu_id"))
        chip_id = item.get("chip_id", 0)
        if not (_is_int(device_id) and _is_int(chip_id)):
            continue
        fields = {f.name: _field(f.name, item[f.name]) for f in dataclasses.fields(DeviceReading)
                  if f.name in item and f.name in _FLOATS | _INTS | _STRS}
        readings.append(DeviceReading(vendor=vendor, device_id=device_id, chip_id=chip_id, **fields))
    if not readings:
        raise ParseError("JSON readings hold no object with an integer device_id (or npu_id)")
    return readings
