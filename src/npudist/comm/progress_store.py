"""What the hang watchdog keeps in the job's store, and how it is read back: each rank's progress record,
where each rank runs, and the hang reader's keys (control counter, probe, answers, stacks, verdict).

Keys carry torchrun's restart count, so a restarted job never reads the records of the attempt before it.
Parsing is pure and never trusts what it reads (a record of the wrong shape is a BadRecord).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import socket
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch.distributed as dist

from npudist.accelerators.place import Place, from_doc
from npudist.runtime import compat
from npudist.runtime.state import peek

log = logging.getLogger("npudist.comm")


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


def _attempt() -> str:
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def _key(rank: int | str) -> str:
    # A restarted job (torchrun --max-restarts) must not read records of the previous attempt.
    return f"npudist/watchdog/{_attempt()}/{rank}"


# The reader's keys, beside the records: the control counter, the probe's suspects, the answers of one
# probe, a rank's stack, and the verdict.
def ctl_key() -> str:
    return _key("ctl")


def want_key() -> str:
    return _key("want")


def answers_key(gen: int) -> str:
    return _key(f"answers/{gen}")


def stack_key(rank: int) -> str:
    return _key(f"stack/{rank}")


def verdict_key() -> str:
    return _key("verdict")


def who_key(rank: int) -> str:
    return _key(f"who/{rank}")


def _where_i_run() -> dict[str, Any]:
    """What a rank publishes once about where it runs (accelerators.place.Place's fields): its host and pid,
    the process table its pid belongs to, torchrun's LOCAL_RANK, and the accelerator row it detected."""
    from npudist.comm.process_table import identity

    rt = peek()
    local = os.environ.get("LOCAL_RANK", "")
    return {"host": socket.gethostname(), "pid": os.getpid(), "local_rank": int(local) if local.isdigit() else None,
            "accelerator": getattr(rt.accelerator, "name", None) if rt is not None else None,
            "process_table": identity()}


def shared_store() -> Any:
    """The process group's own store client (TCPStore behind prefixes), or None.

    One client per rank is enough: the TCPStore client serialises its requests internally, and the
    watchdog only issues calls that return at once (set, add, append, and gets of keys known to exist).
    """
    get = getattr(dist.distributed_c10d, "_get_default_store", None)
    try:
        return get() if get is not None and dist.is_initialized() else None
    except (RuntimeError, ValueError):
        return None


WHO_AT_MOST = 64
"""Ranks whose host and pid one report looks up (a line names a few; the rest are in the records)."""


def read_places(store: Any, ranks: list[int]) -> dict[int, Place]:
    """Where ``ranks`` said at their start that they run (host, pid, local rank, accelerator): one ``check``
    and one ``multi_get``, and nothing when some key is missing (a rank that never started) or the store
    fails."""
    out: dict[int, Place] = {}
    ranks = ranks[:WHO_AT_MOST]
    keys = [who_key(r) for r in ranks]
    try:
        if store is None or not keys or not compat.store_has_all(store, keys):
            return out
        for r, raw in zip(ranks, store.multi_get(keys), strict=True):
            doc = json.loads(raw)
            if isinstance(doc, dict) and isinstance(doc.get("host"), str) and isinstance(doc.get("pid"), int):
                out[r] = from_doc(doc)
    except Exception as exc:  # names are a courtesy: the report stands without them
        log.debug("where the ranks run is not readable: %s", exc)
    return out


def read_who(store: Any, ranks: list[int]) -> dict[int, tuple[str, int]]:
    """(host, pid) of ``ranks``, from read_places."""
    return {r: (p.host or "", p.pid or 0) for r, p in read_places(store, ranks).items()}


def _published_verdict(store: Any) -> dict[str, Any] | None:
    try:
        if compat.store_has(store, verdict_key()):
            doc = json.loads(store.get(verdict_key()))
            return doc if isinstance(doc, dict) else None
    except Exception as exc:  # the abort goes on without the culprit's name
        log.debug("verdict not readable: %s", exc)
    return None


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


def group_key(name: str) -> str:
    return _key(f"group/{name}")


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


def read_group(store: Any, name: str) -> GroupInfo | None:
    """A group's members as its members published them; None when none did (or the store fails)."""
    if not name:
        return None
    try:
        if store is None or not compat.store_has(store, group_key(name)):
            return None
        return parse_group(name, store.get(group_key(name)))
    except Exception as exc:  # membership is a refinement: the verdict stands on the records without it
        log.debug("group %s not readable: %s", name, exc)
        return None
