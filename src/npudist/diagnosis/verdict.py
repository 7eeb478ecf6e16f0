"""A hang verdict as a record: what rank 0's reader says, prints, writes and acts on.

``judge`` (hang.py) makes one; the reader (npudist.comm.hang.reader) prints its ``line``, writes
``to_json()`` to the run directory (``hang-attempt<N>.json``, the format ``npudist diagnose`` and the report
read: report/verdicts.py), publishes it for the other ranks, and aborts when ``abort_after_seconds`` allows.
Per-rank mappings are keyed by rank number here and by its string in the JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from npudist.diagnosis.place import Place, iso
from npudist.diagnosis.record import BadRecord, Record, record_json


@dataclass(frozen=True)
class Culprit:
    """One rank the verdict blames: its last record, whether it answered the probe, its state and where it runs."""

    last: str
    """Its last published call and how long ago ("last all_reduce #7 (entered, 12.0 s ago)")."""
    alive: bool | None
    """It answered the probe (None: no probe was made)."""
    state: str
    """rank_states: stopped, gone, silent, starved, busy, declared, stuck, out_of_order..."""
    place: Place = field(default_factory=Place)
    next_commands: tuple[str, ...] = ()
    stack: str | None = None
    """Its main thread's Python stack, when it answered."""
    cpu_ratio: float | None = None
    busy: str | None = None
    """The label of the npudist.busy() block it is in."""

    def to_json(self) -> dict[str, Any]:
        return {"last": self.last, "alive": self.alive, "state": self.state, "stack": self.stack,
                "cpu_ratio": self.cpu_ratio, "busy": self.busy, **self.place.fields(),
                "next_commands": list(self.next_commands)}


@dataclass(frozen=True)
class Verdict:
    line: str
    """The one line rank 0 prints: who the job waits on, in which call, what happens next."""
    kind: str
    """behind, ahead, mismatch or all_reached (hang.Suspects)."""
    op: str | None
    seq: int
    """The call's number on its group (the first one the culprits never reached)."""
    group: str | None
    group_desc: str | None
    waiting: tuple[int, ...]
    culprits: tuple[int, ...]
    not_reached: tuple[int, ...]
    reached: tuple[int, ...]
    culprit_ranks: Mapping[int, Culprit]
    states: Mapping[int, str]
    abort_after_seconds: float | None
    """Stall after which the job is aborted: 0 now, None never (rank_states.abort_after)."""
    held_back: tuple[int, ...]
    """Live ranks behind with the dead ones: they wait on them."""
    stalled_seconds: float
    bound_seconds: float
    time: float
    cause: str | None
    """The failing collective's error, when a collective failed."""
    records: Mapping[int, Record | BadRecord | None] = field(default_factory=lambda: MappingProxyType({}))
    """The culprits' last records (the JSON's ``ranks``)."""
    busy_only: bool = False
    """Every culprit is busy, declared busy or starved: said as ``npudist busy:``, not a hang."""
    first_time: float | None = None
    """When the reader first gave a verdict for this stall."""

    def to_json(self) -> dict[str, Any]:
        doc = {"line": self.line, "kind": self.kind, "op": self.op, "seq": self.seq, "group": self.group,
               "group_desc": self.group_desc, "waiting": list(self.waiting), "culprits": list(self.culprits),
               "not_reached": list(self.not_reached), "reached": list(self.reached),
               "culprit_ranks": {str(r): c.to_json() for r, c in self.culprit_ranks.items()},
               "states": {str(r): st for r, st in self.states.items()},
               "abort_after_seconds": self.abort_after_seconds, "held_back": list(self.held_back),
               "stalled_seconds": self.stalled_seconds, "bound_seconds": self.bound_seconds, "time": self.time,
               "iso_time": iso(self.time), "cause": self.cause,
               "ranks": {str(r): record_json(rec) for r, rec in self.records.items()}}
        if self.first_time is not None:
            doc["first_time"] = self.first_time
        return doc
