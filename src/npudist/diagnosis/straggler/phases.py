"""Where each rank's step goes, and which rank the others wait for: pure arithmetic over measured times.

A step (optimizer step to optimizer step) splits into five phases that sum to it exactly:

- ``other``: from the last step's end to the step's first batch request (logging, checkpoints, evaluation);
- ``data``: time inside the DataLoader iterator (or ``data_wait`` blocks);
- ``comm_wait`` and ``comm_transfer``: the time the rank was blocked on communication (npudist.ddp: the end
  of backward waiting for its gradient buckets; other jobs: the time any collective was in flight, from the
  process-group watch), split below;
- ``compute``: the rest.

Wait versus transfer. A collective ends when the last rank has joined and the bytes have moved; on gloo no
clock says when each peer arrived, so the split is estimated from numbers every rank already exchanges: the
rank that waited least at the sync point is the one the others waited for, and its own blocked time is
close to the pure transfer time. So ``transfer = min over ranks of the blocked time`` (per step, from the last
window) and ``wait = blocked - transfer``. msprof's cluster analysis splits communication the same way
(wait: a late peer; transfer: a slow link) and flags a wait ratio above 0.2 (as quoted in issue #44; its
own analysis reads per-op timestamps from device traces, which gloo does not have). The estimate overstates
transfer when every rank waits (no rank is ever first), and it takes one window to learn; before that the
blocked time counts as transfer, so no rank is accused early.

The culprit. DDP evens out backward time across ranks (a 200 ms busy wait on one rank showed 292 vs 293 ms
of backward everywhere, issue #44), so a slow rank is not the one with long phases but the one that waited
least: ``culprit`` picks it, measures the gap (how much longer the others waited than it did) and names a
cause only when the rank's excess in one phase over the others' median explains most (``MOST``) of that gap.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from npudist.diagnosis.straggler.skew import SkewReport

PHASES = ("data", "compute", "comm_wait", "comm_transfer", "other")
"""The label values of npudist_rank_phase_seconds, in display order."""
CAUSES = ("data", "compute", "other")
"""Phases in which a rank's own extra time can make the others wait (ties broken in this order); its
transfer is the job's estimate, the same on every rank, and its wait is what the others pay, not a cause."""
MOST = 0.5
"""A cause is named when its excess is more than this share of the gap: it explains most of it."""
WAIT_RATIO_FLAG = 0.2
"""msprof's cluster analysis flags a rank whose communication wait is above this share of its step."""


@dataclass(frozen=True, kw_only=True)
class StepPhases:
    """Seconds of one step (or mean seconds per step over a window) in each phase."""

    data: float = 0.0
    compute: float = 0.0
    comm_wait: float = 0.0
    comm_transfer: float = 0.0
    other: float = 0.0

    @property
    def comm(self) -> float:
        return self.comm_wait + self.comm_transfer

    @property
    def total(self) -> float:
        return self.data + self.compute + self.comm_wait + self.comm_transfer + self.other

    def items(self) -> tuple[tuple[str, float], ...]:
        return tuple((p, getattr(self, p)) for p in PHASES)


def _seconds(v: float | None) -> float:
    """A measured time, or 0 where a clock gave nothing usable (NaN, negative, infinite)."""
    return float(v) if v is not None and math.isfinite(v) and v > 0 else 0.0


def split_step(*, step_s: float, data_s: float = 0.0, comm_s: float = 0.0, other_s: float = 0.0,
               transfer_s: float | None = None) -> StepPhases:
    """One step's phases, summing to ``step_s`` exactly: ``other``, ``data`` and the blocked ``comm`` are
    each clipped to what the step has left (in that order: overlapping clocks never make a phase
    negative), compute is the rest, and comm splits into transfer (at most ``transfer_s``, the job's
    per-step estimate; None: not known yet, all of it) and wait."""
    left = _seconds(step_s)
    other = min(_seconds(other_s), left)
    left -= other
    data = min(_seconds(data_s), left)
    left -= data
    comm = min(_seconds(comm_s), left)
    transfer = comm if transfer_s is None else min(comm, _seconds(transfer_s))
    return StepPhases(data=data, compute=left - comm, comm_wait=comm - transfer, comm_transfer=transfer,
                      other=other)


def transfer_estimate(blocked: Sequence[float | None]) -> float | None:
    """The job's transfer time per step: the least blocked time of any rank that measured one (the rank
    the others waited for barely waits itself). None when no rank measured one."""
    known = [float(b) for b in blocked if b is not None and math.isfinite(b) and b >= 0]
    return min(known) if known else None


def wait_ratio(phases: StepPhases) -> float:
    """Communication wait over the step (msprof flags above WAIT_RATIO_FLAG); 0 for an empty step."""
    total = phases.total
    return phases.comm_wait / total if total > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class Culprit:
    """The rank the others waited for, by how much, and the phase that explains it (None: no single one)."""

    rank: int
    gap_s: float
    """The others' median comm wait minus this rank's, seconds per step: what it cost each of them."""
    cause: str | None
    excess_s: tuple[tuple[str, float], ...]
    """(phase, this rank's seconds per step minus the others' median) for each of CAUSES."""
    others_wait_ratio: float
    """The others' median comm wait over their step (msprof flags above WAIT_RATIO_FLAG)."""

    @property
    def excess(self) -> float:
        return dict(self.excess_s).get(self.cause, 0.0) if self.cause else 0.0

    def text(self) -> str:
        """``rank 1: data +41 ms per step``, or, with no single cause, the gap alone."""
        if self.cause is None:
            return f"rank {self.rank}: +{self.gap_s * 1e3:.0f} ms per step, no single phase explains it"
        return f"rank {self.rank}: {self.cause} +{self.excess * 1e3:.0f} ms per step"


def culprit(ranks: Sequence[StepPhases | None], *, most: float = MOST) -> Culprit | None:
    """The rank that waited least among ``ranks`` (mean phases per step, by rank; None: unknown), the gap
    the others waited for it, and its cause; None with fewer than two known ranks or no gap."""
    known = [(r, p) for r, p in enumerate(ranks) if p is not None]
    if len(known) < 2:
        return None
    rank, mine = min(known, key=lambda rp: (rp[1].comm_wait, rp[0]))
    others = [p for r, p in known if r != rank]
    gap = statistics.median(p.comm_wait for p in others) - mine.comm_wait
    if not gap > 0:
        return None
    excess = tuple((c, getattr(mine, c) - statistics.median(getattr(p, c) for p in others)) for c in CAUSES)
    best, amount = max(excess, key=lambda ce: (ce[1], -CAUSES.index(ce[0])))
    ratio = statistics.median(wait_ratio(p) for p in others)
    return Culprit(rank=rank, gap_s=gap, cause=best if amount > most * gap else None, excess_s=excess,
                   others_wait_ratio=ratio)


def window_phases(report: SkewReport) -> list[StepPhases | None]:
    """Each rank's mean phases per step over an exchanged window (None: the rank sent no phase columns),
    its blocked time split with the window's own transfer estimate (the least blocked rank's)."""
    transfer = transfer_estimate(report.comm_waits)
    out: list[StepPhases | None] = []
    for rank in range(len(report.means)):
        cols = [v[rank] if rank < len(v) else None
                for v in (report.data_waits, report.comm_waits, report.others, report.computes)]
        if any(c is None for c in cols):
            out.append(None)
            continue
        data, comm, other, compute = (_seconds(c) for c in cols)
        moved = comm if transfer is None else min(comm, transfer)
        out.append(StepPhases(data=data, compute=compute, comm_wait=comm - moved, comm_transfer=moved,
                              other=other))
    return out
