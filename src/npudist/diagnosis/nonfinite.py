"""The sentinel's rules, pure: who went non-finite (the stop line), when a loss is a spike, and when a
GradScaler's skipped steps are too many. npudist/training/sentinel.py feeds them and acts on their answers.

- Stop: a non-finite loss or gradient on any rank stops every rank before that step's optimizer update;
  the line names the rank(s), host, card, step and the first bucket/parameter that went non-finite
  (Megatron stops on a NaN gradient norm the same way; torchtitan raises on the bad rank only, so the
  others wait out the collective timeout).
- Spike: a finite loss above ``factor`` x the running maximum of the losses before it warns (Megatron's
  spiky-loss check uses 10x); the spike itself does not raise the maximum, so a run of spikes keeps warning.
- Skips: torch.amp.GradScaler skips the optimizer step whose gradients overflowed and lowers its scale;
  that is the scaler working, never a stop. ``warn_after`` skips in a row warn (the scale keeps falling:
  the overflow is in the data or the model, not in the scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SPIKE_WARNINGS = 5
"""Spike lines a rank prints; later spikes are counted in the last line only."""


@dataclass(frozen=True, kw_only=True)
class Culprit:
    """One rank's own finding in the step the flag was raised."""

    rank: int
    host: str
    card: str
    loss: float | None = None
    """Its loss, when that was what went non-finite."""
    first: str | None = None
    """Scan mode: the first bucket (and its first parameter) that held a non-finite gradient."""

    def describe(self) -> str:
        what = [f"loss={self.loss}"] if self.loss is not None else []
        what += [f"first non-finite gradient in {self.first}"] if self.first else []
        return f"rank {self.rank} (host {self.host}, card {self.card}): {', '.join(what) or 'non-finite'}"


@dataclass(frozen=True, kw_only=True)
class NonFiniteStop:
    """The agreed verdict: every rank stops at ``step``."""

    step: int
    culprits: tuple[Culprit, ...]
    gradient: str | None = None
    """No rank's loss was non-finite: the first parameter whose reduced gradient is (any rank could hold it)."""

    def line(self) -> str:
        if self.culprits:
            who = "; ".join(c.describe() for c in self.culprits[:8])
            more = f"; and {len(self.culprits) - 8} more rank(s)" if len(self.culprits) > 8 else ""
            head = f"non-finite at step {self.step} on {who}{more}"
        else:
            grad = f" (first: {self.gradient})" if self.gradient else ""
            head = (f"non-finite gradient at step {self.step}{grad}, every rank's loss finite; run with "
                    "NPUDIST_SENTINEL=scan to name the rank")
        return (f"npudist: {head}. Every rank stopped before this step's optimizer update; the last checkpoint "
                "holds the last finite state")

    def as_json(self) -> dict[str, object]:
        return {"step": self.step, "line": self.line(), "gradient": self.gradient,
                "culprits": [{"rank": c.rank, "host": c.host, "card": c.card,
                              "loss": None if c.loss is None else str(c.loss), "first": c.first}
                             for c in self.culprits]}


class SpikeRule:
    """Loss above ``factor`` x its running maximum: a warning line (``check`` returns it), never a stop."""

    def __init__(self, factor: float = 10.0) -> None:
        if not factor > 1.0:
            raise ValueError(f"spike factor {factor!r}: give a number above 1 (10 means 10x the running maximum)")
        self.factor = factor
        self.maximum: float | None = None
        self.spikes = 0

    def check(self, step: int, loss: float, rank: int) -> str | None:
        if not math.isfinite(loss):
            return None  # the stop's business, not a spike's
        peak = self.maximum
        if peak is not None and peak > 0 and loss > self.factor * peak:
            self.spikes += 1
            if self.spikes > SPIKE_WARNINGS:
                return None
            tail = "; later spikes are not shown" if self.spikes == SPIKE_WARNINGS else ""
            return (f"npudist: loss spike at step {step} on rank {rank}: {loss:.6g} is {loss / peak:.1f}x its "
                    f"running maximum {peak:.6g} (NPUDIST_SPIKE_FACTOR={self.factor:g}){tail}")
        self.maximum = loss if peak is None else max(peak, loss)
        return None


class SkipStreak:
    """Steps in a row whose optimizer update a GradScaler skipped (its non-finite flag never reached an
    optimizer step); the ``warn_after``-th, and every ``warn_after`` more, warn."""

    def __init__(self, warn_after: int = 20) -> None:
        if warn_after < 1:
            raise ValueError(f"skip warning after {warn_after!r} steps: give a positive number")
        self.warn_after = warn_after
        self.count = 0

    def skipped(self, flagged: bool, step: int) -> str | None:
        if not flagged:
            return None  # no update and nothing non-finite: gradient accumulation, an evaluation backward
        self.count += 1
        if self.count % self.warn_after:
            return None
        return (f"npudist: {self.count} optimizer steps in a row skipped for non-finite gradients (up to step "
                f"{step}): the GradScaler keeps lowering its scale, so the overflow is in the data or the model")

    def stepped(self) -> None:
        self.count = 0


__all__ = ["Culprit", "NonFiniteStop", "SkipStreak", "SpikeRule"]
