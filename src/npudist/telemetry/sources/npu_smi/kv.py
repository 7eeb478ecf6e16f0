"""Parsers for ``npu-smi info -t usages|power|temp|memory|health|common -i N [-c C]`` key/value outputs.

Each output becomes partial DeviceReadings (only the fields that query prints; the rest None), keyed by
(NPU ID, Chip ID) so a poller can merge several queries with ``merge_readings``.

Layout facts, from the recordings in ``tests/fakes/npu-smi/t-*.txt``:
- blocks are separated by blank lines; ``Chip ID`` comes after a chip's fields on 910B but before them on
  310B, so a whole block belongs to the Chip ID printed anywhere in it;
- the controller chip's block (``Chip Name : MCU``/``mcu``, first or last line of the block) repeats keys
  such as ``Temperature(C)``; it is not an AI chip and is skipped;
- spacing and case vary (``Temperature (C)``/``Temperature(C)``, ``MHZ``), so keys are normalised.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from npudist.telemetry.sources import _values as v
from npudist.telemetry.sources.merge import merge_readings
from npudist.telemetry.sources.readings import DeviceReading, ParseError

# Normalised key -> (DeviceReading field, converter to base units).
KV_FIELDS: Mapping[str, tuple[str, Callable[[str], Any]]] = MappingProxyType({
    "npu real-time power(w)": ("power_watts", v.non_negative),
    "temperature(c)": ("temperature_celsius", v.celsius),
    "npu temperature(c)": ("temperature_celsius", v.celsius),
    "aicore usage rate(%)": ("utilization_ratio", v.ratio_from_percent),
    "aicore curfreq(mhz)": ("frequency_hertz", v.mhz_to_hertz),
    "health status": ("health", v.health),
    "hbm capacity(mb)": ("hbm_total_bytes", v.capacity_mib),
    "ddr capacity(mb)": ("ddr_total_bytes", v.capacity_mib),
    # 310B "-t usages": the chip's only memory (DDR), printed without the DDR prefix.
    "memory capacity(mb)": ("memory_total_bytes", v.capacity_mib),
})
# Deliberately not read: usage *rates* of memory (a percentage of capacity is too coarse to report as
# bytes used), "Aicore Freq" (rated, not current), "Power Dissipation(W)" (MCU block: the card's power).


def normalise_key(key: str) -> str:
    """``NPU Temperature (C)`` -> ``npu temperature(c)``: case and spacing differ between drivers."""
    key = re.sub(r"\s+", " ", key.strip().lower())
    return re.sub(r"\s*\(\s*", "(", key).replace(" )", ")")


def parse_kv_blocks(text: str) -> list[dict[str, str]]:
    """Blank-line separated blocks of ``key : value`` lines, keys normalised, first occurrence kept."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
            current = {}
            continue
        key, sep, value = line.partition(":")
        if sep and key.strip():
            current.setdefault(normalise_key(key), value.strip())
    if current:
        blocks.append(current)
    return blocks


def parse_kv(text: str, npu_id: int | None = None, chip_id: int | None = None) -> list[DeviceReading]:
    """Partial readings from one ``npu-smi info -t ...`` output.

    ``npu_id``/``chip_id`` are the ``-i``/``-c`` the caller passed; printed IDs win over them (``-t health``
    prints neither, so the caller's are needed there). ParseError when no chip value is found.
    """
    readings: list[DeviceReading] = []
    current_npu = npu_id
    for block in parse_kv_blocks(text):
        if "npu id" in block:
            current_npu = v.integer(block["npu id"])
        if block.get("chip name", "").strip().lower() == "mcu":
            continue
        fields = {KV_FIELDS[k][0]: KV_FIELDS[k][1](raw) for k, raw in block.items() if k in KV_FIELDS}
        if not fields:
            continue
        chip = v.integer(block["chip id"]) if "chip id" in block else chip_id if chip_id is not None else 0
        if current_npu is None or chip is None:
            raise ParseError("npu-smi key/value output has chip values but no readable NPU ID/Chip ID; "
                             "pass npu_id= (and chip_id=) as given to -i/-c")
        if "memory_total_bytes" not in fields:
            fields["memory_total_bytes"] = fields.get("hbm_total_bytes") or fields.get("ddr_total_bytes")
        readings.append(DeviceReading(vendor="npu", device_id=current_npu, chip_id=chip, **fields))
    if not readings:
        raise ParseError("no known `npu-smi info -t` key (e.g. 'NPU Real-time Power(W)', 'Temperature(C)', "
                         "'Health Status') in the text")
    return merge_readings(readings)
