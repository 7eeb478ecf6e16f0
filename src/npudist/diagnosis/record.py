"""What each rank publishes about its collectives, as the diagnosis reads it: the progress record, a
process group's members, and their parsers (pure; never trusts what it reads: a record of the wrong shape is
a BadRecord, a group that is not one is None).

The watchdog (npudist.comm.hang.watchdog) writes these into the job's store; the hang reader
(npudist.comm.hang.reader) reads them back and hands them to the verdict (npudist.diagnosis.hang).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass
class Record:
    rank: int
    seq: int = 0
    step: int = 0
    """DDP forward passes with gradients so far (ddp.py): the rank's training step."""
    op: str = ""
    nbytes: int = 0
    state: str = "idle"
    """entered (waiting inside the collective), done, or closed (npudist.shutdown() ran after it)."""
    wall_time: float = 0.0
    group: str = ""
    """The process group of that collective (torch's group name; "" when calls are numbered without groups:
    the process-group watch is off, and ``seq`` orders npudist's own collectives)."""
    gseq: int = 0
    """Its number on that group: the ranks of one group issue the group's collectives in one order, so
    positions are compared per group, never across groups (a subgroup call moves only its members)."""
    groups: dict[str, int] = field(default_factory=dict)
    """Collectives entered so far on each group this rank used (at most GROUPS_AT_MOST)."""


GROUPS_AT_MOST = 64
"""Groups a record lists: a rank of a 5-D parallel job (data, shard, tensor, pipeline, expert) uses a few."""


def position(rec: Record, group: str) -> int:
    """How many collectives of ``group`` the rank has entered ("": npudist's own numbering, ``seq``)."""
    return rec.seq if not group else rec.groups.get(group, 0)


@dataclass(frozen=True)
class BadRecord:
    """A store record that is not a Record (wrong JSON, wrong field types): reported, never trusted."""

    reason: str


_FIELD_TYPES = MappingProxyType(
    {"rank": int, "seq": int, "step": int, "op": str, "nbytes": int, "state": str, "wall_time": (int, float),
     "group": str, "gseq": int, "groups": dict})


def parse_record(raw: bytes | str, rank: int) -> Record | BadRecord:
    """Rank ``rank``'s published record, or BadRecord saying what is wrong with it (pure; never raises)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return BadRecord(f"not JSON: {str(exc)[:80]}")
    if not isinstance(doc, dict) or set(doc) != set(_FIELD_TYPES):
        return BadRecord(f"expected an object with {', '.join(_FIELD_TYPES)}")
    wrong = [k for k, t in _FIELD_TYPES.items() if isinstance(doc[k], bool) or not isinstance(doc[k], t)]
    if wrong or not math.isfinite(doc["wall_time"]):
        return BadRecord(f"wrong type or value for {', '.join(wrong) or 'wall_time'}")
    if doc["rank"] != rank:
        return BadRecord(f"published for rank {rank} but names rank {doc['rank']}")
    groups = doc["groups"]
    if len(groups) > GROUPS_AT_MOST or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in groups.items()):
        return BadRecord(f"groups must map at most {GROUPS_AT_MOST} group names to collective counts")
    return Record(**doc)


Records = dict[int, "Record | BadRecord | None"]


def record_json(rec: Record | BadRecord | None) -> dict[str, Any] | None:
    """A record as the reports write it (a bad one as what was wrong with it)."""
    if isinstance(rec, BadRecord):
        return {"bad_record": rec.reason}
    return asdict(rec) if rec is not None else None


@dataclass(frozen=True)
class GroupInfo:
    """A process group's members (global ranks) and torch's description of it (DeviceMesh groups say their
    dimension: ``mesh_shard``), published once by the members that use it."""

    name: str
    ranks: tuple[int, ...]
    desc: str = ""

    @property
    def label(self) -> str:
        """How a verdict names the group: its description (a DeviceMesh dimension) and its ranks."""
        more = len(self.ranks) - 8
        shown = ", ".join(map(str, self.ranks[:8])) + (f" and {more} more" if more > 0 else "")
        desc = self.desc[5:] if self.desc.startswith("mesh_") else self.desc
        what = f"mesh dimension {desc!r}" if self.desc.startswith("mesh_") else (desc or "group")
        return f"{what} {self.name} (ranks {shown})"


GROUP_RANKS_AT_MOST = 1 << 20
"""Members a published group may claim: more than any job has ranks."""


def encode_ranks(ranks: list[int] | tuple[int, ...]) -> dict[str, Any]:
    """A group's members in O(1) bytes when they are evenly spaced (every DeviceMesh dimension, new_group of
    a range), else the list."""
    rs = list(ranks)
    if len(rs) >= 2 and all(b - a == rs[1] - rs[0] for a, b in itertools.pairwise(rs)) and rs[1] > rs[0]:
        return {"start": rs[0], "step": rs[1] - rs[0], "count": len(rs)}
    return {"ranks": rs}


def parse_group(name: str, raw: bytes | str) -> GroupInfo | None:
    """A published group (pure; None for anything that is not one)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    desc = doc.get("desc") if isinstance(doc.get("desc"), str) else ""
    ints = [doc.get(k) for k in ("start", "step", "count")]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
        start, step, count = ints  # type: ignore[misc]
        if start >= 0 and step > 0 and 0 < count <= GROUP_RANKS_AT_MOST:
            return GroupInfo(name, tuple(range(start, start + step * count, step)), desc[:200])
        return None
    ranks = doc.get("ranks")
    if isinstance(ranks, list) and 0 < len(ranks) <= GROUP_RANKS_AT_MOST and all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        return GroupInfo(name, tuple(ranks), desc[:200])
    return None
