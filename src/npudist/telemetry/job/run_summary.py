"""The end-of-run summary rank 0 prints: how the run went, in a few lines instead of one warning per window.

Fed like the straggler diagnosis (append to ``StepTimer.on_exchange`` on rank 0); it only counts, so the
console can stay quiet while the job runs and still say at the end which rank the straggler detector
flagged and how often, the straggler diagnoses and the checkpoints.
"""

from __future__ import annotations

import collections
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from npudist.diagnosis.straggler.skew import SkewReport

SLOWEST_CHANCE = 0.01
"""The summary names a persistently slowest rank when chance alone would make some rank that often the
slowest in fewer than 1 run in 100 (binomial tail, times the ranks)."""


def _binomial_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))


@dataclass
class RunSummary:
    """Counts the windows in which the StragglerDetector flagged a rank, as the exchanges arrive; ``lines()``
    renders them with the run directory's files."""

    windows: int = 0
    flagged: int = 0
    """Windows with at least one flagged rank."""
    max_skew: float = 0.0
    """Largest stddev/mean of a window (the seed's board figure; it judges nothing here)."""
    worst: tuple[float, int, SkewReport] | None = None
    """(slowdown, rank, window) of the largest slowdown of a flagged rank."""
    stragglers: collections.Counter[tuple[int, tuple[int, int] | None]] = field(
        default_factory=collections.Counter)
    """(rank, (device, chip) or None) -> windows in which the detector flagged it."""
    flagged_ratios: dict[int, list[tuple[float, SkewReport]]] = field(default_factory=dict)
    """rank -> (its ratio, the window) for each window in which it was flagged, oldest first."""
    ranks: int = 0
    """Largest world size seen in a window."""
    slowest: collections.Counter[int] = field(default_factory=collections.Counter)
    """rank -> windows in which it had the longest mean work time."""
    slowest_ratios: dict[int, list[float]] = field(default_factory=dict)
    """rank -> its ratio to the median of the others in the windows in which it was the slowest."""

    def __call__(self, report: SkewReport) -> None:
        self.windows += 1
        self.max_skew = max(self.max_skew, report.skew)
        if len(report.means) > 1:
            r = report.straggler
            self.slowest[r] += 1
            ratio = report.ratios[r] if r < len(report.ratios) else None
            if ratio is not None and math.isfinite(ratio):
                self.slowest_ratios.setdefault(r, []).append(ratio)
        self.ranks = max(self.ranks, len(report.means))
        if not report.flagged:
            return
        self.flagged += 1
        for r in report.flagged:
            self.stragglers[(r, report.devices[r] if r < len(report.devices) else None)] += 1
            ratio = report.ratios[r] if r < len(report.ratios) and report.ratios[r] is not None else 0.0
            self.flagged_ratios.setdefault(r, []).append((ratio, report))
            if self.worst is None or ratio > self.worst[0]:
                self.worst = (ratio, r, report)

    def skew_line(self) -> str:
        if not self.windows:
            return "straggler: no window exchanged (fewer steps than --exchange-every, or telemetry off)"
        if not self.flagged:
            return (f"straggler: no rank flagged in {self.windows} windows (max skew {self.max_skew:.3f})"
                    + self._persistently_slowest())
        (rank, device), count = self.stragglers.most_common(1)[0]
        where = "" if device is None else f" (device {device[0]} chip {device[1]})"
        assert self.worst is not None
        ratio, worst_rank, w = self.worst
        other = "" if worst_rank == rank else (f"; worst of all: rank {worst_rank} at {ratio:.2f}x (steps "
                                               f"{w.first_step}-{w.last_step})")
        return (f"straggler: rank {rank}{where} flagged in {count} of {self.windows} windows, "
                f"{self._slowdowns(rank)} the median of the other ranks{other}; "
                f"{self.flagged} window(s) with a flagged rank, max skew {self.max_skew:.3f}")

    def _slowdowns(self, rank: int) -> str:
        """Its slowdown where the console's line named it (the first flagged window) and at its worst, each
        with its steps: one number alone differed from the console's for the same straggler, with nothing
        to say that they measure different windows."""
        seen = self.flagged_ratios.get(rank, [])
        if not seen:
            return "n/a"
        (first, f), (most, m) = seen[0], max(seen, key=lambda x: x[0])
        if m is f:
            return f"at {first:.2f}x (steps {f.first_step}-{f.last_step})"
        return (f"at {first:.2f}x when first flagged (steps {f.first_step}-{f.last_step}, the console's line), "
                f"{most:.2f}x at worst (steps {m.first_step}-{m.last_step})")

    def _persistently_slowest(self) -> str:
        """A rank that was the slowest in more windows than chance makes (each rank is the slowest in 1/N of
        the windows of a job without a straggler) is named even when no window crossed the flag threshold:
        consistently a little slower is a card worth a look."""
        if not self.slowest or self.ranks < 2:
            return ""
        rank, count = min(self.slowest.items(), key=lambda kv: (-kv[1], kv[0]))
        if self.ranks * _binomial_tail(self.windows, count, 1 / self.ranks) >= SLOWEST_CHANCE:
            return ""
        ratios = self.slowest_ratios.get(rank)
        median = f" (median {statistics.median(ratios):.2f}x the median of the others)" if ratios else ""
        return (f"; rank {rank} was the slowest in {count} of {self.windows} windows{median}, below the flag "
                "threshold")

    def lines(self, run_dir: str | os.PathLike[str] | None = None, checkpoints: CheckpointLines | None = None,
              diagnosing: bool = True) -> list[str]:
        """The summary's lines: skew, then (with a run directory) diagnoses and checkpoints. ``diagnosing``:
        whether this run wrote diagnosis files at all (off, "none" would read as "no straggler")."""
        out = [self.skew_line()]
        if run_dir is not None:
            diagnoses = sorted(Path(run_dir).glob("straggler-step*.json"))
            none = "none" if diagnosing else ("off (--straggler-diagnosis WINDOWS writes RUN_DIR/straggler-step*.json "
                                              "after WINDOWS flagged windows in a row)")
            out.append("straggler diagnoses: " + (", ".join(str(p) for p in diagnoses) if diagnoses else none))
        if checkpoints is not None:
            out.append(checkpoints.line())
        return out


@dataclass(frozen=True)
class CheckpointLines:
    """What this rank's checkpoint writer did (``npudist.checkpoint.stats()``) and the steps kept on disk."""

    run_dir: str
    kept: tuple[int, ...]
    saves: int
    blocked_s: float
    """Total time save() held the training loop."""
    written_s: float
    """Total time writing (background or inline)."""
    failures: int

    def line(self) -> str:
        if not self.saves:
            return f"checkpoints: none written in {self.run_dir}"
        kept = ", ".join(f"step {s}" for s in self.kept) or "none"
        return (f"checkpoints: {self.saves} written in {self.run_dir} (kept: {kept}); save blocked training "
                f"{self.blocked_s / self.saves * 1e3:.0f} ms and wrote for {self.written_s / self.saves * 1e3:.0f} "
                f"ms on average; {self.failures} failed")


def checkpoint_lines(run_dir: str) -> CheckpointLines:
    """Read the checkpoint writer's figures for the summary (call after the last save finished)."""
    from npudist import checkpoint

    stats = checkpoint.stats()
    return CheckpointLines(run_dir, tuple(sorted(checkpoint.list_checkpoints(run_dir))), stats.snapshot.count,
                           stats.snapshot.sum_seconds, stats.write.sum_seconds, stats.failures)
