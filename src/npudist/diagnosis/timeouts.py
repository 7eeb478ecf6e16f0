"""Timeouts every rank must share, compared across the job: which ranks differ from the majority, in one line.

Why: HCCL's timeouts are read per process from its environment, and a multi-node job's nodes are often set
up apart (a node's profile, a container image). Unequal ``HCCL_CONNECT_TIMEOUT`` or ``HCCL_EXEC_TIMEOUT``
make the ranks give up at different times: one side reports a link-setup timeout (EI0006) or an execution
timeout while its peers wait on, and the error names neither the variable nor the rank (issue 46). Each
rank publishes its values once at start (comm/hang/watchdog.py, through the job's store) and rank 0 judges
them here; a difference is only said, never fatal.

Pure: values in, a line out, so it is tested on recorded values and replayed at any world size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TIMEOUT_VARS = (
    # (variable, what unequal values do). CANN envref (HCCL_CONNECT_TIMEOUT, HCCL_EXEC_TIMEOUT): read by each
    # process at its communicator's creation, never exchanged between ranks.
    ("HCCL_CONNECT_TIMEOUT", "one side gives up on link set-up (EI0006) while its peers still wait"),
    ("HCCL_EXEC_TIMEOUT", "one side aborts a collective (EI0002) while its peers still wait in it"),
    ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "one side's NCCL watchdog kills its rank before its peers'"),
    ("NPUDIST_TIMEOUT", "the process group's collective timeout ends one side first"),
    ("NPUDIST_HANG_TIMEOUT", "ranks disagree on when a job without progress is judged hung"),
)
"""A row per variable that the ranks of one job must agree on."""
UNSET = "unset"
"""What a rank without the variable publishes: its backend's default, which a set value elsewhere differs from."""
NAMED_AT_MOST = 8
"""Ranks named per odd value; the rest are counted."""


def mine(env: Mapping[str, str]) -> dict[str, str]:
    """This rank's values of TIMEOUT_VARS (what it publishes): the set ones only, stripped."""
    return {var: env[var].strip() for var, _ in TIMEOUT_VARS if env.get(var, "").strip()}


@dataclass(frozen=True)
class Disagreement:
    """One variable whose value is not the same on every rank."""

    var: str
    majority: str
    """The value most ranks have (the lowest rank's value breaks a tie); UNSET when most have none."""
    agreeing: int
    """How many ranks have the majority's value."""
    odd: tuple[tuple[str, tuple[int, ...]], ...]
    """Each other value, with the ranks that have it."""
    effect: str


def disagreements(values: Mapping[int, Mapping[str, str]]) -> list[Disagreement]:
    """The variables of TIMEOUT_VARS not equal on every rank in ``values`` (rank -> what it published)."""
    out = []
    for var, effect in TIMEOUT_VARS:
        by_value: dict[str, list[int]] = {}
        for rank in sorted(values):
            by_value.setdefault(values[rank].get(var, UNSET), []).append(rank)
        if len(by_value) < 2:
            continue
        majority = max(by_value, key=lambda v: (len(by_value[v]), -by_value[v][0]))
        odd = tuple((v, tuple(rs)) for v, rs in sorted(by_value.items(), key=lambda kv: kv[1][0]) if v != majority)
        out.append(Disagreement(var=var, majority=majority, agreeing=len(by_value[majority]), odd=odd, effect=effect))
    return out


def _ranks(ranks: Iterable[int], hosts: Mapping[int, str]) -> str:
    rs = list(ranks)
    shown = ", ".join(f"{r} ({hosts[r]})" if r in hosts else str(r) for r in rs[:NAMED_AT_MOST])
    more = f" and {len(rs) - NAMED_AT_MOST} more" if len(rs) > NAMED_AT_MOST else ""
    return f"rank{'s' if len(rs) > 1 else ''} {shown}{more}"


def line(found: list[Disagreement], hosts: Mapping[int, str] | None = None) -> str | None:
    """The one line rank 0 prints (None when every rank agrees): each variable, the odd ranks (with their
    host where known) against the majority, and the fix."""
    if not found:
        return None
    hosts = hosts or {}
    parts = []
    for d in found:
        odd = "; ".join(f"{v} on {_ranks(rs, hosts)}" for v, rs in d.odd)
        parts.append(f"{d.var} is {d.majority} on {d.agreeing} rank{'s' if d.agreeing > 1 else ''} but {odd} "
                     f"({d.effect})")
    fixes = "; ".join(f"export {d.var}={d.majority}" if d.majority != UNSET else f"unset {d.var}" for d in found)
    return (f"npudist: timeouts differ between ranks: {'; '.join(parts)}. Fix: the same value on every node, "
            f"in the job's environment (`{fixes}` on each node before `npudist launch`); the job goes on")
