"""Hang verdicts from progress records: pure arithmetic, fed by the reader (hang_reader.py).

Two pure parts, replayable at any world size without a process group:

- ``ProgressTracker.update(now, records)``: has the job stopped progressing for longer than its bound?
  Progress is any change of any rank's (collective number, state, step). The bound is deduced from the
  job itself, like nvidia-resiliency-ext's fault-tolerance timeouts (the longest interval seen so far
  times a safety factor; ``nvidia_resiliency_ext/fault_tolerance/config.py``, ``safety_factor``), with a
  floor, or fixed by NPUDIST_HANG_TIMEOUT. A stall counts only while some rank waits inside a collective:
  ranks that all compute (a long evaluation) are not hung.
- ``suspects(records)`` and ``judge(...)``: which ranks hold the job back and why. A rank is *behind* when
  its collective number is below the one most ranks wait in (it never reached that call), *ahead* when it
  is above (it skipped a call the others are in). When every rank sits at the same number, ranks whose
  op or payload differs from the majority's are named (a mismatched collective), else the ranks that did
  not answer the liveness probe (stopped or dead inside the collective).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from npudist.diagnosis import rank_states
from npudist.diagnosis.place import Place, next_commands
from npudist.diagnosis.rank_states import Look
from npudist.diagnosis.record import BadRecord, GroupInfo, Record, Records, position
from npudist.diagnosis.verdict import Culprit, Verdict
from npudist.runtime.settings import DEFAULT_STUCK_TIMEOUT_S as DEFAULT_STUCK_S

FLOOR_S = 10.0
"""The smallest stall bound: a few publish intervals and scheduling noise on a loaded host."""
SAFETY_FACTOR = 3.0
"""Bound = this many times the longest progress interval observed."""
GAP_WINDOW = 256
"""Progress intervals remembered for the bound (the recent past, so a slow start-up is forgotten)."""
NAMED_IN_LINE = 8
"""Ranks listed by number in the verdict line; the JSON report holds them all."""


def _progress(records: Records) -> tuple[int, bool, bool]:
    """(a number that grows whenever any rank makes progress, whether some rank waits inside a collective,
    whether some rank has started a training step)."""
    total, waiting, stepping = 0, False, False
    for rec in records.values():
        if isinstance(rec, Record):
            total += 2 * rec.seq + (rec.state == "done") + rec.step
            waiting = waiting or rec.state == "entered"
            stepping = stepping or rec.step > 0
    return total, waiting, stepping


@dataclass
class ProgressTracker:
    """Says when the job has made no progress for longer than its bound (see the module docstring)."""

    floor_s: float = FLOOR_S
    factor: float = SAFETY_FACTOR
    override_s: float | None = None
    """NPUDIST_HANG_TIMEOUT: a fixed bound in seconds instead of the deduced one."""
    _last: int | None = None
    _since: float = 0.0
    _gaps: collections.deque = field(default_factory=lambda: collections.deque(maxlen=GAP_WINDOW))
    _changes: int = 0
    _stepping: bool = False

    @property
    def bound_s(self) -> float:
        if self.override_s is not None:
            return self.override_s
        return max(self.floor_s, self.factor * max(self._gaps, default=0.0))

    def prime(self, records: Records, since: float, bound_s: float) -> None:
        """Start from ``records`` as if they had stood still since ``since`` (a reader that takes over
        mid-stall: the records' own wall times say when the job last moved), with a fixed bound."""
        self._last, self._since, self.override_s = _progress(records)[0], since, bound_s

    def stalled_for(self, now: float) -> float:
        """Seconds since the last progress seen (0 before the first update)."""
        return now - self._since if self._last is not None else 0.0

    def update(self, now: float, records: Records) -> float | None:
        """Seconds the job has been stalled when that exceeds the bound, else None."""
        value, waiting, stepping = _progress(records)
        if stepping and not self._stepping:
            # Set-up before the first training step (model build, DDP's start-up broadcasts) is no
            # progress interval of the training loop; neither is the first interval seen.
            self._stepping, self._changes = True, 0
            self._gaps.clear()
        if value != self._last:
            if self._changes > 0:
                self._gaps.append(now - self._since)
            self._changes += self._last is not None
            self._last, self._since = value, now
            return None
        stalled = now - self._since
        return stalled if waiting and stalled > self.bound_s else None


@dataclass(frozen=True)
class Suspects:
    kind: str
    """behind (ranks below the collective the others wait in), ahead (ranks past it: they skipped a call),
    mismatch (same number, other op or size),
    all_reached (every rank inside the same call: the ones that do not answer are named)."""
    ranks: list[int]
    top: int
    """The collective number most ranks sit at: the call the job waits in (its number on ``group``)."""
    waiting: list[int]
    """Ranks inside the top collective: the ones held back."""
    group: str = ""
    """The process group of that call ("" when calls are numbered without groups)."""


def _majority(groups: dict[tuple[str, int], list[int]]) -> tuple[str, int]:
    return max(groups, key=lambda g: (len(groups[g]), -min(groups[g])))


def _inside(rec: Record, group: str) -> bool:
    """The rank waits inside a collective of ``group``."""
    return rec.state == "entered" and rec.group == group


def _in_group(records: Records, group: str, members: tuple[int, ...] | None) -> Suspects:
    """Suspects within one group: positions on ``group`` compared among its members only (pure)."""
    good = {r: rec for r, rec in records.items() if isinstance(rec, Record)}
    if members is not None:
        scope = [r for r in members if r in records]
    elif group:  # members not published: the ranks whose records show they use the group
        scope = sorted(r for r, rec in good.items() if group in rec.groups or rec.group == group)
    else:
        scope = sorted(records)
    unknown = sorted(r for r in scope if r not in good)
    pos = {r: position(good[r], group) for r in scope if r in good}
    lowest = min(pos.values(), default=0)
    last = [r for r, p in pos.items() if p == lowest]
    if not unknown and len(set(pos.values())) > 1 and not any(_inside(good[r], group) for r in last):
        # The lowest ranks finished their last call and never entered the next one: everyone above waits on
        # them, directly or through a call that cannot finish without them (a broadcast's root stays inside
        # it while the receivers that got their data go on), so the first call they never reached is the
        # one the job waits in, however the others are spread above it.
        top = lowest + 1
        waiting = sorted(r for r, p in pos.items() if p >= top and _inside(good[r], group))
        return Suspects("behind", sorted(last), top, waiting, group)
    counts = collections.Counter(pos.values())
    top = max(counts, key=lambda p: (counts[p], p)) if counts else 0
    behind = sorted(r for r, p in pos.items() if p < top)
    ahead = sorted(r for r, p in pos.items() if p > top)
    waiting = sorted(r for r, p in pos.items() if p == top and _inside(good[r], group))
    if behind or unknown:
        return Suspects("behind", sorted(behind + unknown), top, waiting, group)
    if ahead:
        return Suspects("ahead", ahead, top, waiting, group)
    calls: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for r in pos:
        if good[r].group == group:
            calls[(good[r].op, good[r].nbytes)].append(r)
    if len(calls) > 1:
        keep = _majority(calls)
        odd = sorted(r for g, rs in calls.items() if g != keep for r in rs)
        return Suspects("mismatch", odd, top, sorted(calls[keep]), group)
    return Suspects("all_reached", sorted(pos), top, waiting, group)


def waiting_groups(records: Records) -> list[str]:
    """The groups some rank waits inside, most waiting ranks first."""
    inside = collections.Counter(rec.group for rec in records.values()
                                 if isinstance(rec, Record) and rec.state == "entered")
    return sorted(inside, key=lambda g: (-inside[g], g))


def suspects(records: Records, members: Mapping[str, tuple[int, ...]] | None = None) -> Suspects:
    """The ranks to probe and blame (pure; O(N) per group some rank waits in).

    Positions are compared per process group (``Record.groups``): a subgroup's calls move only its members,
    so a rank that waits on the default group while others run a subgroup call is never out of order. In
    each group some rank waits inside, the call the group waits in is the one most of its members sit at
    (ties: the highest number, since a stalled rank is usually the odd one below); members below it are
    behind, members above it ran past a call the others are still in (they skipped one); members that
    never reported are behind. ``members``: a group's ranks as published (progress_store.read_group); else
    the ranks whose records use the group. Of several waiting groups (a chain: HSDP's shard group waits on a
    rank that itself waits in its replicate group), the one whose suspects do not themselves wait in
    another group's call is chosen: that is where the chain ends.
    """
    members = members or {}
    groups = waiting_groups(records)
    if not groups:
        common = collections.Counter(rec.group for rec in records.values() if isinstance(rec, Record))
        groups = [max(common, key=lambda g: (common[g], g))] if common else [""]
    found = {g: _in_group(records, g, members.get(g)) for g in groups}

    def waits_elsewhere(r: int, g: str) -> bool:
        rec = records.get(r)
        other = rec.group if isinstance(rec, Record) and rec.state == "entered" else None
        return other is not None and other != g and other in found and found[other].kind != "all_reached"

    def ends_chain(g: str) -> bool:
        return found[g].kind != "all_reached" and any(not waits_elsewhere(r, g) for r in found[g].ranks)

    return found[min(groups, key=lambda g: (not ends_chain(g), groups.index(g)))]


def _ranks(ranks: Iterable[int]) -> str:
    rs = list(ranks)
    shown = ", ".join(map(str, rs[:NAMED_IN_LINE]))
    return shown + (f" and {len(rs) - NAMED_IN_LINE} more" if len(rs) > NAMED_IN_LINE else "")


def _last(rec: Record | BadRecord | None, now: float) -> str:
    if isinstance(rec, BadRecord):
        return f"bad record ({rec.reason})"
    if rec is None or rec.seq == 0:
        return "never reported a collective"
    where = {"entered": "inside", "closed": "shut npudist down after"}.get(rec.state, "after")
    call = f"{rec.op} #{rec.gseq} of group {rec.group}" if rec.group else f"{rec.op} #{rec.seq}"
    return f"{where} {call} ({rec.nbytes} bytes, step {rec.step}, {now - rec.wall_time:.1f} s ago)"


def _top_frame(stack: str) -> str:
    lines = [ln.strip() for ln in stack.strip().splitlines() if ln.strip().startswith("File ")]
    return lines[-1] if lines else ""


def judge(records: Records, found: Suspects, answered: set[int] | None, stacks: Mapping[int, Look | str], *,
          now: float, stalled_s: float, bound_s: float, cause: str = "",
          who: Mapping[int, Place] | None = None, processes: Mapping[int, str] | None = None,
          stuck_s: float = DEFAULT_STUCK_S, busy_s: float | None = None, action: str = "abort",
          group: GroupInfo | None = None) -> Verdict:
    """The verdict (verdict.py), whose ``line`` is the one line rank 0 prints (pure).

    ``answered``: the suspects whose watchdog thread answered the probe (None: no probe was made);
    ``stacks``: their answers (rank_states.Look, or a bare stack); ``who``: where the ranks that said so
    run (host, pid, local rank, accelerator), which each culprit's entry and next commands carry;
    ``processes``: what this host's process table says of a rank it holds; ``group``: the members of the
    group the job waits in, as published (None: not known). Each culprit gets a state
    (rank_states.py), and the verdict says after how long of stall the job is aborted
    (``abort_after_s``: 0 now, None never).
    """
    looks = {r: v if isinstance(v, Look) else Look(stack=v) for r, v in stacks.items()}
    who, processes = who or {}, processes or {}
    if found.kind == "all_reached" and answered is not None:
        culprits = sorted(r for r in found.ranks if r not in answered)
    elif found.kind == "all_reached":
        culprits = []
    else:
        culprits = list(found.ranks)
    good = {r: rec for r, rec in records.items() if isinstance(rec, Record)}
    states = {r: rank_states.classify(
        out_of_order=found.kind in ("ahead", "mismatch"),
        closed=isinstance(records.get(r), Record) and records[r].state == "closed",
        probed=answered is not None, look=looks.get(r) if answered is not None and r in answered else None,
        process=processes.get(r), inside_passed=isinstance(records.get(r), Record) and records[r].state == "entered"
        and records[r].group == found.group and position(records[r], found.group) < found.top) for r in culprits}
    # Where some are certainly dead, the live ones behind with them are waiting on them (a node lost with a
    # collective in flight): the dead are named, the others listed as held back.
    dead = [r for r in culprits if states[r] in (rank_states.GONE, rank_states.STOPPED, rank_states.SILENT)]
    held = [r for r in culprits if r not in dead] if dead else []
    if held:
        culprits = dead
        states = {r: states[r] for r in dead}
    inside = found.kind == "all_reached" and answered is not None and not culprits
    after = rank_states.abort_after([rank_states.STUCK] if inside else list(states.values()),
                                    stuck_s=stuck_s, busy_s=busy_s)
    top_rec = next((good[r] for r in found.waiting if r in good), None)
    # The call the waiting ranks are in: where they all sit at one number (which may be past the first call the
    # culprits never reached, found.top), that number.
    sitting = {position(good[r], found.group) for r in found.waiting if r in good}
    number = sitting.pop() if len(sitting) == 1 else found.top
    in_call = f"{top_rec.op} #{number}" if top_rec else f"collective #{number}"
    if group is not None:
        in_call += f" on {group.label}"
    elif found.group:
        in_call += f" of group {found.group}"
    per_rank: dict[int, Culprit] = {}
    parts = []
    for r in culprits:
        look = looks.get(r) if answered is not None and r in answered else None
        place = who.get(r, Place())
        per_rank[r] = Culprit(last=_last(records.get(r), now), alive=None if answered is None else r in answered,
                              state=states[r], place=place,
                              next_commands=tuple(next_commands("hang", place, state=states[r])),
                              stack=look.stack if look and look.stack else None,
                              cpu_ratio=round(look.cpu_ratio, 3) if look else None,
                              busy=look.busy if look and look.busy else None)
        if len(parts) < NAMED_IN_LINE:
            top = _top_frame(look.stack) if look else ""
            local = f", local rank {place.local_rank}" if place.local_rank is not None else ""
            at = f" ({place.host} pid {place.pid}{local})" if place.host else ""
            parts.append(f"rank {r}{at} {_last(records.get(r), now)}, "
                         f"{rank_states.describe(states[r], look, processes.get(r))}" + (f", at {top}" if top else ""))
    blame = {"behind": "never reached it", "ahead": "ran past it (a skipped collective?)",
             "mismatch": "called something else there",
             "all_reached": "did not answer inside it"}[found.kind]
    if culprits:
        who_line = f"rank(s) {_ranks(culprits)} {blame}: " + "; ".join(parts)
        if len(culprits) > NAMED_IN_LINE:
            who_line += f"; {len(culprits) - NAMED_IN_LINE} more in the report"
        first = per_rank[culprits[0]].next_commands
        if first:
            who_line += f"; next: {first[0]}"
    else:
        who_line = "every rank is alive inside it (a slow link, or a backend stuck below Python)"
    busy_only = bool(states) and all(st in (rank_states.BUSY, rank_states.DECLARED, rank_states.STARVED)
                                     for st in states.values())
    line = (f"npudist {'busy' if busy_only else 'hang'}: no progress for {stalled_s:.1f} s (bound {bound_s:.1f} s); "
            f"ranks {_ranks(found.waiting) or 'none'} wait in {in_call}; {who_line}")
    if held:
        line += f"; rank(s) {_ranks(held)} answered but wait on them"
    if cause:
        line += f". Collective error: {cause}"
    line += _next(after, action, states, busy_s)
    if group is not None:
        scope = [r for r in group.ranks if r in records]
    elif found.group:
        scope = sorted(r for r, rec in good.items() if found.group in rec.groups or rec.group == found.group)
    else:
        scope = sorted(records)
    not_reached = sorted(r for r in scope if not isinstance(records[r], Record)
                         or position(records[r], found.group) < found.top)
    return Verdict(line=line, kind=found.kind, op=top_rec.op if top_rec else None, seq=found.top,
                   group=found.group or None, group_desc=group.desc if group is not None else None,
                   waiting=tuple(found.waiting), culprits=tuple(culprits), not_reached=tuple(not_reached),
                   reached=tuple(r for r in scope if r not in not_reached),
                   culprit_ranks=MappingProxyType(per_rank), states=MappingProxyType(dict(states)),
                   abort_after_seconds=after, held_back=tuple(held), stalled_seconds=stalled_s,
                   bound_seconds=bound_s, time=now, cause=cause or None,
                   records=MappingProxyType({r: records[r] for r in culprits}), busy_only=busy_only)


def _next(after: float | None, action: str, states: Mapping[int, str], busy_s: float | None) -> str:
    """What npudist does next, in the verdict's words."""
    if action != "abort":
        return f". NPUDIST_HANG_ACTION={action}: npudist aborts nothing"
    if after == 0:
        return ""
    if after is None:
        declared = all(st == rank_states.DECLARED for st in states.values())
        hint = "" if declared else '; mark such phases with `with npudist.busy("evaluation"):`'
        return (". Not a hang: npudist does not abort a busy rank (the collective timeout still applies; "
                f"NPUDIST_BUSY_TIMEOUT sets a bound){hint}")
    if {rank_states.SILENT, rank_states.STARVED} & set(states.values()) and after == rank_states.SILENT_ABORT_S:
        which = "a rank that does not answer: silence alone is not proof of death"
    elif after == busy_s and rank_states.STUCK not in states.values():
        which = "NPUDIST_BUSY_TIMEOUT"
    else:
        which = "NPUDIST_STUCK_TIMEOUT"
    return f". The job is aborted if it makes no progress for {after:.0f} s in all ({which})"
