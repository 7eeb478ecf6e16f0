"""Parser for ``npu-smi info -m``: which (NPU ID, Chip ID) is which logical device index.

The NPU ID is only a label (0, 32, 32768, 224 occur); torch_npu and ``ASCEND_RT_VISIBLE_DEVICES`` count
chips by "Chip Logic ID". Controller chips (``Mcu``) print ``-`` there and are left out. Recording:
``tests/fakes/npu-smi/info-m-mapping.txt``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from npudist.telemetry import _values as v
from npudist.telemetry.readings import DeviceReading, ParseError

_WANTED = ("npu id", "chip id", "chip logic id")


def parse_mapping(text: str) -> dict[tuple[int, int], int]:
    """{(npu_id, chip_id): logical_id}; ParseError without the header or any chip that has a logical ID."""
    lines = text.splitlines()
    # Header columns are separated by 2+ spaces; names themselves hold single spaces.
    headers = [[n.lower() for n in re.split(r"\s{2,}", line.strip())] for line in lines]
    start = next((i for i, names in enumerate(headers) if all(w in names for w in _WANTED)), None)
    if start is None:
        raise ParseError("not `npu-smi info -m` output: no header naming "
                         "'NPU ID', 'Chip ID', 'Chip Logic ID'")
    names = headers[start]
    where = [names.index(w) for w in _WANTED]
    mapping: dict[tuple[int, int], int] = {}
    for line in lines[start + 1:]:
        # Only the last column (Chip Name, e.g. "Ascend 910B3") may contain spaces.
        cells = line.split(None, len(names) - 1)
        if len(cells) < len(names):
            continue
        npu, chip, logic = (v.integer(cells[i]) for i in where)
        if npu is not None and chip is not None and logic is not None:
            mapping.setdefault((npu, chip), logic)
    if not mapping:
        raise ParseError("`npu-smi info -m` output lists no chip with a numeric Chip Logic ID")
    return mapping


def with_logical_ids(readings: Iterable[DeviceReading],
                     mapping: dict[tuple[int, int], int]) -> list[DeviceReading]:
    """Fill logical_id from an ``info -m`` mapping where the reading does not know it yet."""
    return [dataclasses.replace(r, logical_id=mapping.get((r.device_id, r.chip_id)))
            if r.logical_id is None else r for r in readings]
