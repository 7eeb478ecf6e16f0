"""Where a rank runs and the next command to run there: the fields every diagnosis carries (hang and
straggler files, their console lines, `npudist diagnose`), so a verdict says which host, process and card
to look at, and how, in that vendor's own tool.

Pure: the writers (comm's hang reader, telemetry's straggler diagnosis) and the reader (report) share it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from npudist.accelerators.vendors import BY_NAME

STACK_COMMAND = "py-spy dump --pid {pid}"
"""A running rank's Python stack without stopping it (py-spy, https://github.com/benfred/py-spy)."""


@dataclass(frozen=True)
class Place:
    """Where a rank ran: its host and process, its rank on the host, its accelerator row and physical card."""

    host: str | None = None
    pid: int | None = None
    local_rank: int | None = None
    accelerator: str | None = None
    card: int | None = None
    chip: int | None = None
    process_table: str | None = None
    """Where ``pid`` means something: the kernel's boot id and the pid namespace (comm/process_table.py)."""

    def fields(self) -> dict[str, Any]:
        return asdict(self)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def from_doc(doc: Mapping[str, Any], base: Place | None = None) -> Place:
    """``base`` with what a document states itself (a diagnosis file or a rank's published record; it was
    written on the rank's own host). Fields of the wrong type are ignored, never trusted."""
    base = base or Place()
    device = doc.get("device") if isinstance(doc.get("device"), dict) else {}
    card = _int(doc.get("card")) if _int(doc.get("card")) is not None else _int(device.get("npu_id"))
    chip = _int(doc.get("chip")) if _int(doc.get("chip")) is not None else _int(device.get("chip_id"))
    local = _int(doc.get("local_rank"))
    return Place(host=_text(doc.get("host"), 255) or base.host, pid=_int(doc.get("pid")) or base.pid,
                 local_rank=local if local is not None else base.local_rank,
                 accelerator=_text(doc.get("accelerator"), 32) or base.accelerator,
                 card=card if card is not None else base.card, chip=chip if chip is not None else base.chip,
                 process_table=_text(doc.get("process_table"), 100) or base.process_table)


def where(rank: int | None, place: Place) -> str:
    """'rank 3, local rank 1, on node2, pid 4242, card 5 chip 0': as much as is known."""
    parts = [f"rank {rank}" if rank is not None else "no rank named"]
    if place.local_rank is not None:
        parts.append(f"local rank {place.local_rank}")
    if place.host:
        parts.append(f"on {place.host}")
    if place.pid:
        parts.append(f"pid {place.pid}")
    if place.card is not None:
        parts.append(f"card {place.card}" + (f" chip {place.chip}" if place.chip is not None else ""))
    return ", ".join(parts)


def device_command(place: Place) -> str | None:
    """The card's health and vitals in its vendor's tool (the vendor table's health_command); None when the
    accelerator has no tool or the physical card is not known (a logical index would name the wrong card)."""
    vendor = BY_NAME.get(place.accelerator or "")
    if vendor is None or vendor.health_command is None or place.card is None:
        return None
    return vendor.health_command.format(card=place.card, chip=place.chip if place.chip is not None else 0)


def next_commands(kind: str, place: Place, cause: str | None = None, state: str | None = None) -> tuple[str, ...]:
    """What to run next on the rank's host: its stack for a hang, its card's vitals for a slow compute. A
    hung rank's ``state`` (comm/rank_states.py) picks the command: a stopped process has no stack to dump,
    a gone one no pid to look at."""
    on = f" (on {place.host})" if place.host else ""
    out = []
    if kind == "hang" and state == "stopped" and place.pid:
        out.append(f"grep State /proc/{place.pid}/status; kill -CONT {place.pid} resumes it" + on)
    elif place.pid and state != "gone" and (kind == "hang" or cause != "compute"):
        out.append(STACK_COMMAND.format(pid=place.pid) + on)
    device = device_command(place)
    if device and kind in ("straggler", "hang"):
        out.append(device + on)
    if kind == "straggler" and cause == "communication":
        out.append("npudist bench collective --op all_reduce (its links against the others')")
    if kind == "straggler" and cause == "data":
        out.append("profile the input pipeline on that host (DataLoader num_workers, storage reads)")
    return tuple(out)


def iso(seconds: float | None) -> str | None:
    """UTC ISO 8601 time, None for a time that is missing or outside what the platform can date."""
    if seconds is None or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return None
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
    except (OverflowError, OSError, ValueError):
        return None
