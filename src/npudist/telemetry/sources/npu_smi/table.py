"""Parser for the default ``npu-smi info`` table (devices on top, processes at the bottom).

Layouts differ between cards and drivers (910B, A3 with ``Phy-ID``, 310/310P/310B with ``Chip Device``,
newer ones with ``NPU ID``/``NPU Util(%)``; 26.x prints wider cells), so nothing here uses character
offsets. Rows are split on ``|``; each cell's header text is matched against the column vocabulary
below, and the cell's values (whitespace-separated, ``used / total`` pairs kept together) are assigned
to those columns in order. A device spans as many lines as its header has. Recordings of every layout
named here are in ``tests/fakes/npu-smi/`` (README there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from npudist.telemetry.sources import _values as v
from npudist.telemetry.sources.json_readings import parse_json
from npudist.telemetry.sources.readings import DeviceReading, ParseError, ProcessReading


@dataclass(frozen=True)
class Column:
    pattern: str
    """Header text, as a case-insensitive regex."""
    key: str | None
    """Where the value goes in the parsed row; None for columns we read past (Hugepages, Phy-ID)."""
    pair: bool = False
    """Printed as ``used / total``."""
    text: bool = False
    """Free text that may contain spaces (names); absorbs extra words in its cell."""


# Order matters: longer names first, so "NPU Util(%)" is not read as "NPU".
COLUMNS: tuple[Column, ...] = (
    Column(r"NPU\s*Util\s*\(%\)", "util"),
    Column(r"NPU\s*ID", "npu"),
    Column(r"NPU", "npu"),
    Column(r"Name", "name", text=True),
    Column(r"Health", "health"),
    Column(r"Power\s*\(W\)", "power"),
    Column(r"Temp\s*\(C\)", "temp"),
    Column(r"Hugepages[-\s]?Usage\s*\(page\)", None, pair=True),
    Column(r"Chip\s*Logic\s*ID", "logical"),
    Column(r"Chip\s*ID", "chip"),
    Column(r"Chip", "chip"),
    # 310-style frames: "Device" numbers chips across all cards (0..n-1), the runtime's logical index.
    Column(r"Device", "logical"),
    Column(r"Phy[-\s]?ID", None),
    Column(r"Bus[-\s]?Id", "bus"),
    Column(r"AI\s*Core\s*\(%\)", "util"),
    Column(r"Memory[-\s]?Usage\s*\(MB\)", "ddr", pair=True),
    Column(r"HBM[-\s]?Usage\s*\(MB\)", "hbm", pair=True),
    Column(r"Process\s*id", "pid"),
    Column(r"Process\s*name", "pname", text=True),
    Column(r"Process\s*memory\s*\(MB\)", "pmem"),
)
_COLUMN_RES = tuple((re.compile(c.pattern + r"(?=\s|$)", re.IGNORECASE), c) for c in COLUMNS)
_NA_SLASH = re.compile(r"\[?N/A\]?", re.IGNORECASE)  # "N/A" holds a slash: not a used/total pair
_GROUP = re.compile(r"([^\s/]+)\s*/\s*([^\s/]+)|\S+")

Raw = str | tuple[str, str] | None


@dataclass(frozen=True)
class NpuSmiTable:
    """Everything one ``npu-smi info`` print holds."""

    devices: tuple[DeviceReading, ...]
    processes: tuple[ProcessReading, ...]
    problems: tuple[str, ...] = ()
    """Rows that were skipped (cut off, unreadable IDs), one line each, for logs and doctor output."""


@dataclass
class _Line:
    number: int
    cells: list[str]
    complete: bool


@dataclass
class _Group:
    """Consecutive ``|`` rows, and the frame line that ended them (``=`` marks a header's end)."""

    lines: list[_Line] = field(default_factory=list)
    heavy_end: bool = False


def header_columns(cell: str) -> list[Column]:
    """The columns a header cell names, left to right; unknown words become ignored columns."""
    cols: list[Column] = []
    pos = 0
    while pos < len(cell):
        if cell[pos].isspace():
            pos += 1
            continue
        for regex, col in _COLUMN_RES:
            m = regex.match(cell, pos)
            if m:
                cols.append(col)
                pos = m.end()
                break
        else:
            word = re.match(r"\S+", cell[pos:])
            assert word is not None
            cols.append(Column(re.escape(word.group()), None))
            pos += word.end()
    return cols


def _groups(cell: str) -> list[Raw]:
    out: list[Raw] = []
    for m in _GROUP.finditer(_NA_SLASH.sub("NA", cell)):
        out.append((m.group(1), m.group(2)) if m.group(1) is not None else m.group())
    return out


def cell_values(cell: str, cols: list[Column]) -> dict[str, Raw]:
    """Assign a data cell's values to its header's columns; an ambiguous value is left out, not guessed."""
    if len(cols) == 1:
        (col,) = cols
        if col.pair:
            found = _groups(cell)
            return {col.key: found[0]} if col.key and len(found) == 1 else {}
        return {col.key: cell.strip()} if col.key else {}
    found = _groups(cell)
    texts = [i for i, c in enumerate(cols) if c.text]
    if len(found) > len(cols) and texts:
        # Extra words belong to the free-text column (a name with spaces).
        t = texts[0]
        tail = len(cols) - t - 1
        middle = found[t: len(found) - tail]
        joined = " ".join(g if isinstance(g, str) else f"{g[0]}/{g[1]}" for g in middle)
        found = [*found[:t], joined, *found[len(found) - tail:]]
    if len(found) == len(cols):
        return {c.key: g for c, g in zip(cols, found, strict=True) if c.key}
    # A blank value shifted the rest: keep what can be matched by shape (pairs to pair columns).
    out: dict[str, Raw] = {}
    pairs = [g for g in found if isinstance(g, tuple)]
    singles = [g for g in found if isinstance(g, str)]
    pair_cols = [c for c in cols if c.pair]
    single_cols = [c for c in cols if not c.pair]
    if len(pairs) == len(pair_cols):
        out.update({c.key: g for c, g in zip(pair_cols, pairs, strict=True) if c.key})
    if len(singles) == len(single_cols):
        out.update({c.key: g for c, g in zip(single_cols, singles, strict=True) if c.key})
    return out


def _split_lines(text: str) -> list[_Group | str]:
    """Rows grouped between frame lines; other non-blank lines kept as strings (they break groups)."""
    items: list[_Group | str] = []
    current = _Group()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("+") and set(line) <= set("+-= "):
            current.heavy_end = "=" in line
            items.append(current)
            current = _Group()
        elif line.startswith("|"):
            parts = line.split("|")
            complete = len(parts) > 2 and line.endswith("|")
            current.lines.append(_Line(number, parts[1:-1] if complete else parts[1:], complete))
        elif line:
            items.append(current)
            items.append(line)
            current = _Group()
    items.append(current)
    return [i for i in items if isinstance(i, str) or i.lines]


def _header_kind(group: _Group) -> str | None:
    if not group.heavy_end or not all(ln.complete for ln in group.lines):
        return None
    keys = {c.key for ln in group.lines for cell in ln.cells for c in header_columns(cell)}
    if "pid" in keys:
        return "process"
    if "npu" in keys and keys & {"health", "bus", "name", "power", "temp", "util"}:
        return "device"
    return None


def _rows(text: str) -> tuple[list[tuple[str, dict[str, Raw], int]], list[str], bool]:
    """(table kind, values, line number) per complete row, problems, and whether any header was seen."""
    rows: list[tuple[str, dict[str, Raw], int]] = []
    problems: list[str] = []
    kind: str | None = None
    header: list[list[list[Column]]] = []
    seen_header = False
    for item in _split_lines(text):
        if isinstance(item, str):
            continue
        new_kind = _header_kind(item)
        if new_kind:
            kind, seen_header = new_kind, True
            header = [[header_columns(c) for c in ln.cells] for ln in item.lines]
            continue
        if kind is None:
            continue
        size = len(header)
        for start in range(0, len(item.lines), size):
            chunk = item.lines[start: start + size]
            shapes_match = len(chunk) == size and all(
                ln.complete and len(ln.cells) == len(h) for ln, h in zip(chunk, header, strict=False))
            if not shapes_match:
                if not (kind == "process" and len(chunk[0].cells) == 1):  # "No running processes found"
                    problems.append(f"line {chunk[0].number}: incomplete or misaligned {kind} row skipped")
                continue
            values: dict[str, Raw] = {}
            for ln, hcells in zip(chunk, header, strict=True):
                for cell, cols in zip(ln.cells, hcells, strict=True):
                    for key, raw in cell_values(cell, cols).items():
                        values.setdefault(key, raw)
            rows.append((kind, values, chunk[0].number))
    return rows, problems, seen_header


def _single(raw: Raw) -> str | None:
    return raw if isinstance(raw, str) else None


def _pair_bytes(raw: Raw) -> tuple[int | None, int | None]:
    """``used / total`` MiB -> bytes; a total of 0 means the chip has no such memory."""
    if not isinstance(raw, tuple):
        return None, None
    used, total = v.mib_to_bytes(raw[0]), v.mib_to_bytes(raw[1])
    if not total:
        return None, None
    return used, total


def _device(values: dict[str, Raw]) -> DeviceReading | None:
    npu = v.integer(_single(values.get("npu")))
    chip = v.integer(_single(values.get("chip", "0")))
    if npu is None or chip is None:
        return None
    hbm_used, hbm_total = _pair_bytes(values.get("hbm"))
    ddr_used, ddr_total = _pair_bytes(values.get("ddr"))
    has_hbm = "hbm" in values  # 910B/A3: HBM is the main memory; DDR-only cards have no HBM column
    return DeviceReading(
        vendor="npu",
        device_id=npu,
        chip_id=chip,
        name=v.text(_single(values.get("name"))),
        health=v.health(_single(values.get("health"))),
        power_watts=v.non_negative(_single(values.get("power"))),
        temperature_celsius=v.celsius(_single(values.get("temp"))),
        utilization_ratio=v.ratio_from_percent(_single(values.get("util"))),
        memory_used_bytes=hbm_used if has_hbm else ddr_used,
        memory_total_bytes=hbm_total if has_hbm else ddr_total,
        hbm_used_bytes=hbm_used,
        hbm_total_bytes=hbm_total,
        ddr_used_bytes=ddr_used,
        ddr_total_bytes=ddr_total,
        bus_id=v.text(_single(values.get("bus"))),
        logical_id=v.integer(_single(values.get("logical"))),
    )


def _process(values: dict[str, Raw]) -> ProcessReading | None:
    npu = v.integer(_single(values.get("npu")))
    chip = v.integer(_single(values.get("chip", "0")))
    pid = v.integer(_single(values.get("pid")))
    if npu is None or chip is None or pid is None:
        return None
    return ProcessReading(vendor="npu", device_id=npu, chip_id=chip, pid=pid,
                          name=v.text(_single(values.get("pname"))),
                          memory_used_bytes=v.mib_to_bytes(_single(values.get("pmem"))))


def parse_table(text: str) -> NpuSmiTable:
    """Devices, processes and skipped-row notes from ``npu-smi info``; ParseError if no device row reads."""
    rows, problems, seen_header = _rows(text)
    devices: dict[tuple[int, int], DeviceReading] = {}
    processes: list[ProcessReading] = []
    for kind, values, line in rows:
        if kind == "device":
            dev = _device(values)
            if dev is None:
                problems.append(f"line {line}: device row without a readable NPU/Chip ID skipped")
            elif (dev.device_id, dev.chip_id) in devices:
                problems.append(f"line {line}: NPU {dev.device_id} chip {dev.chip_id} repeated; kept first")
            else:
                devices[(dev.device_id, dev.chip_id)] = dev
        else:
            proc = _process(values)
            if proc is None:
                problems.append(f"line {line}: process row without a readable NPU/Chip/pid skipped")
            else:
                processes.append(proc)
    if not devices:
        if not seen_header:
            raise ParseError("not an `npu-smi info` table: no header row naming NPU, Name/Health/Bus-Id "
                             "followed by a '+====' line; pass the tool's unmodified output")
        raise ParseError("`npu-smi info` table has a header but no complete device row "
                         f"({'; '.join(problems) or 'no rows at all'})")
    return NpuSmiTable(tuple(devices.values()), tuple(processes), tuple(problems))


def parse_processes(text: str) -> list[ProcessReading]:
    """The process table at the bottom of ``npu-smi info``; [] for "No running processes found".

    Needs only the process table (the device part may be cut off); ParseError when neither table is there.
    """
    rows, _, seen_header = _rows(text)
    if not seen_header:
        raise ParseError("not an `npu-smi info` table: no device or process header found")
    return [p for kind, values, _ in rows if kind == "process" and (p := _process(values)) is not None]


def parse(text: str) -> list[DeviceReading]:
    """Device readings from ``npu-smi info`` text, or from a JSON document with DeviceReading's fields.

    Raises only ParseError (a ValueError), when no device row is readable.
    """
    if text.lstrip()[:1] in ("[", "{"):
        return parse_json(text, vendor="npu")
    return list(parse_table(text).devices)
