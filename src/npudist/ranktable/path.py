"""Which way HCCL will build its communicators, said once at launch: from the rank table RANK_TABLE_FILE
names, or by negotiation through the rendezvous store. torch_npu takes the table when the variable is set
and negotiates silently when it is not; a wrong table fails only at the first collective, so launch says
here what the table holds and whether `npudist ranktable check` finds a defect."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from npudist.ranktable.read import load
from npudist.ranktable.table import RankTableError, check

TABLE_VAR = "RANK_TABLE_FILE"


def hccl_path(env: Mapping[str, str]) -> str:
    """``rank table FILE, 16 ranks`` or ``store negotiation ...``; a defective table is named with its first
    defect and the command that lists them all."""
    raw = env.get(TABLE_VAR, "").strip()
    if not raw:
        return f"HCCL: store negotiation ({TABLE_VAR} unset; the ranks exchange their addresses through the " \
               "rendezvous store)"
    try:
        doc = load(Path(raw))
    except RankTableError as exc:
        return f"HCCL: rank table {raw}, unreadable: {exc}"
    defects = check(doc)
    if defects:
        return f"HCCL: rank table {raw} has {len(defects)} defect(s), first {defects[0].line()}; all: " \
               f"npudist ranktable check {raw}"
    ranks = sum(len(s["device"]) for s in doc["server_list"])
    return f"HCCL: rank table {raw}, {ranks} ranks ({len(doc['server_list'])} servers, version {doc['version']})"
