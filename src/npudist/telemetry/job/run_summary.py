"""The end-of-run summary rank 0 prints: how the run went, in a few lines instead of one warning per window.

Fed like the straggler diagnosis (append to ``StepTimer.on_exchange`` on rank 0); it only counts, so the
console can stay quiet while the job runs and still say at the end what the skew windows, straggler
diagnoses and checkpoints were.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field
from pathlib import Path

from npudist.telemetry.job.skew import DEFAULT_THRESHOLD, SkewReport


@dataclass
class RunSummary:
    """Counts skew windows as the exchanges arrive; ``lines()`` renders them with the run directory's files."""

    threshold: float = DEFAULT_THRESHOLD
    windows: int = 0
    skewed: int = 0
    worst: SkewReport | None = None
    stragglers: collections.Counter[tuple[int, tuple[int, int] | None]] = field(
        default_factory=collections.Counter)
    """(rank, (device, chip) or None) -> skewed windows in which it was the slowest."""

    def __call__(self, report: SkewReport) -> None:
        self.windows += 1
        if report.skew <= self.threshold:
            return
        self.skewed += 1
        r = report.straggler
        self.stragglers[(r, report.devices[r] if r < len(report.devices) else None)] += 1
        if self.worst is None or report.skew > self.worst.skew:
            self.worst = report

    def skew_line(self) -> str:
        if not self.windows:
            return "skew: no window exchanged (fewer steps than --exchange-every, or telemetry off)"
        if not self.skewed:
            return f"skew: 0 of {self.windows} windows above {self.threshold:g}"
        (rank, device), count = self.stragglers.most_common(1)[0]
        where = "" if device is None else f" (device {device[0]} chip {device[1]})"
        w = self.worst
        assert w is not None
        return (f"skew: {self.skewed} of {self.windows} windows above {self.threshold:g} "
                f"(worst {w.skew:.3f} over steps {w.first_step}-{w.last_step}); "
                f"straggler rank {rank}{where} in {count} of them")

    def lines(self, run_dir: str | os.PathLike[str] | None = None, checkpoints: CheckpointLines | None = None
              ) -> list[str]:
        """The summary's lines: skew, then (with a run directory) diagnoses and checkpoints."""
        out = [self.skew_line()]
        if run_dir is not None:
            diagnoses = sorted(Path(run_dir).glob("straggler-step*.json"))
            out.append("straggler diagnoses: " + (", ".join(str(p) for p in diagnoses) if diagnoses else "none"))
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
