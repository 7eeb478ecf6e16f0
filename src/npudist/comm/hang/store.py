"""What the hang watchdog keeps in the job's store, and how it is read back: each rank's progress record,
where each rank runs, and the hang reader's keys (control counter, probe, answers, stacks, verdict).

Keys carry torchrun's restart count, so a restarted job never reads the records of the attempt before it.
The records themselves and their pure parsers are npudist.diagnosis.record.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any

import torch.distributed as dist

from npudist.diagnosis.place import Place, from_doc
from npudist.diagnosis.record import (  # noqa: F401  (the record's readers import it from here too)
    GROUP_RANKS_AT_MOST,
    GROUPS_AT_MOST,
    BadRecord,
    GroupInfo,
    Record,
    Records,
    encode_ranks,
    parse_group,
    parse_record,
    position,
)
from npudist.runtime import compat
from npudist.runtime.env import launcher_env
from npudist.runtime.state import peek

log = logging.getLogger("npudist.comm")


def _attempt() -> str:
    return str(launcher_env(os.environ).restart_count)


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
    from npudist.comm.hang.process_table import identity

    rt = peek()
    return {"host": socket.gethostname(), "pid": os.getpid(), "local_rank": launcher_env(os.environ).local_rank,
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


def group_key(name: str) -> str:
    return _key(f"group/{name}")


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


def read_records(store: Any, world: int) -> Records:
    """Every rank's record: one ``multi_get`` when every key exists (one ``check``), else key by key (None for
    a rank that never published, or every rank when there is no store)."""
    keys = [_key(r) for r in range(world)]
    if store is None:
        return dict.fromkeys(range(world))
    try:
        if compat.store_has_all(store, keys):
            return {r: parse_record(raw, r) if raw else None for r, raw in enumerate(store.multi_get(keys))}
    except Exception as exc:
        log.debug("watchdog multi_get failed: %s", exc)
    out: Records = {}
    for r, key in enumerate(keys):
        try:
            raw = store.get(key) if compat.store_has(store, key) else None
            out[r] = parse_record(raw, r) if raw else None
        except Exception:
            out[r] = None
    return out


def wait_for_verdict(store: Any, wait_s: float, period_s: float) -> dict[str, Any] | None:
    """Rank 0's published verdict (its JSON) once it is there, for at most ``wait_s``; None if none came."""
    deadline = time.monotonic() + wait_s
    while store is not None and time.monotonic() < deadline:
        if compat.store_has(store, verdict_key()):
            doc = json.loads(store.get(verdict_key()))
            return doc if isinstance(doc, dict) else None
        time.sleep(period_s)
    return None


def members_doc(name: str) -> dict[str, Any] | None:
    """What a member publishes of group ``name``: its global ranks (compact when evenly spaced) and torch's
    description (DeviceMesh dimensions are ``mesh_<dim>``); None when this process does not hold it."""
    world = getattr(dist.distributed_c10d, "_world", None)
    for pg, pg_name in list(getattr(world, "pg_names", {}).items()):
        desc = str(getattr(pg, "group_desc", "") or "")
        if pg_name == name or (name.startswith("desc:") and desc == name[5:]):
            try:
                return {**encode_ranks(dist.get_process_group_ranks(pg)), "desc": desc}
            except (RuntimeError, ValueError):
                return None
    return None
