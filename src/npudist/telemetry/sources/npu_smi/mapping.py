"""Parser for ``npu-smi info -m``: which (NPU ID, Chip ID) is which logical device index.

The NPU ID is only a label (0, 32, 32768, 224 occur); torch_npu and ``ASCEND_RT_VISIBLE_DEVICES`` count
chips by "Chip Logic ID". Controller chips (``Mcu``) print ``-`` there and are left out. Recording:
``tests/fakes/npu-smi/info-m-mapping.txt``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from npudist.telemetry.sources import _values as v
from npudist.telemetry.sources.readings import DeviceReading, ParseError, RankDevice

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


VISIBLE_DEVICES_VAR = "ASCEND_RT_VISIBLE_DEVICES"
_ID = re.compile(r"[0-9]{1,6}")


class VisibleDevicesError(ValueError):
    """ASCEND_RT_VISIBLE_DEVICES (or the device index) does not name a chip on this node; the message
    says what the Ascend runtime would make of it and how to write it."""


def rank_chip(mapping: dict[tuple[int, int], int], visible: str | None, device_index: int,
              var: str = VISIBLE_DEVICES_VAR) -> RankDevice:
    """Which chip device index ``device_index`` (torch's ``npu:N``, the local rank under torchrun) is.

    ``mapping`` is ``parse_mapping`` of ``npu-smi info -m``; ``visible`` the value of ``var`` (None: unset,
    every chip visible in logical order). The variable lists logical IDs, comma-separated, in ascending
    order, and index N is the N-th listed; the runtime silently stops reading at the first character or ID
    it does not accept ("1, 2" makes only 1 visible). Such values are refused here with what the runtime
    would see, so a rank is never labelled with a chip it does not use (CANN environment variable
    reference, ASCEND_RT_VISIBLE_DEVICES: hiascend.com/document/detail/zh/CANNCommunityEdition/83RC1/
    maintenref/envvar/envref_07_0028.html).
    """
    by_logical: dict[int, tuple[int, int]] = {}
    for chip, logical in sorted(mapping.items()):
        by_logical.setdefault(logical, chip)
    known = sorted(by_logical)
    if device_index < 0:
        raise VisibleDevicesError(f"device index {device_index} is negative")
    if visible is None:
        if device_index not in by_logical:
            raise VisibleDevicesError(f"device index {device_index} is not a chip of this node: `npu-smi info -m` "
                                      f"lists logical IDs {_ids(known)}; start fewer ranks per node")
        return RankDevice(*by_logical[device_index], device_index)
    ids: list[int] = []
    for position, token in enumerate(visible.split(","), 1):
        seen = f"the Ascend runtime stops reading there and sees {_ids(ids) if ids else 'no device'}"
        if not _ID.fullmatch(token):
            raise VisibleDevicesError(
                f"{var}={visible!r}: entry {position} ({token!r}) is not a logical device ID (ASCII digits, "
                f"comma-separated, no spaces); {seen}. Write it like {var}=0,1,2,3")
        logical = int(token)
        if logical not in by_logical:
            raise VisibleDevicesError(
                f"{var}={visible!r}: logical ID {logical} is not a chip of this node (`npu-smi info -m` lists "
                f"{_ids(known)}); {seen}")
        if ids and logical <= ids[-1]:
            raise VisibleDevicesError(f"{var}={visible!r}: IDs must be ascending without repeats (the runtime "
                                      f"supports only ascending order); write {_ids(sorted(set([*ids, logical])))}")
        ids.append(logical)
    if device_index >= len(ids):
        raise VisibleDevicesError(f"device index {device_index} is past the {len(ids)} chip(s) {var}={visible!r} "
                                  f"makes visible; start at most {len(ids)} ranks per node or list more IDs")
    logical = ids[device_index]
    return RankDevice(*by_logical[logical], logical)


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids))
