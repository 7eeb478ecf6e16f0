"""Straggler detection whose sensitivity does not depend on the world size: a pure, stateful detector.

Each window every rank reports its mean *work* time (seconds; NaN = the rank sent nothing). The detector
judges each rank against the others, never against a job-wide spread (stddev/mean dilutes as 1/sqrt(N) when
one rank among N is slow):

1. ``x_i = log(mean_i) - mean_{j != i} log(mean_j)``: the rank's log slowdown against the *other* ranks, so
   a slow rank does not drag its own reference (at N = 2 the reference is the peer). Above 8 ranks the
   reference is the others' median and the spread is clipped at 4 sigma, so a few wild ranks move nothing.
2. The noise of ``x_i`` is learned from what is known at once: the spread of the *other* ranks in every
   window (N - 2 samples a window, none of them rank i's: a rank slow from its first window does not hide
   itself), plus, at N = 2 where there is no spread, rank i's own past windows that were not flagged, plus
   the variation inside the evidence windows. All are independent of the evidence under normal noise, so
   ``sum(x) / (sigma * sqrt(L))`` is Student-t with that many degrees of freedom and the threshold is its
   exact quantile: a young estimate widens it instead of raising false flags.
3. Evidence accumulates over the last L = 1..``max_windows`` windows: the statistic must pass a threshold
   set so that the *job* sees at most ``false_rate`` flagged windows per window whatever N is (Bonferroni
   over ranks and L). Most of the budget goes to the longest L (``LAST_SHARE``): a 1.3x rank among 4 is
   then flagged within 3 windows from a 10-window history (docs/engineering/straggler.md has the replay and, for
   2 ranks, the best any rule can do).
4. At N = 2 a rank slow from the start makes its own past look like noise; a second test with a tenth of the
   budget learns the noise from window-to-window changes of ``x`` (which a constant slowdown does not
   move) and catches it, as the detector did before.
5. A flag also needs the mean slowdown over those L windows to reach ``min_slowdown`` (a 3 % difference
   that is real but harmless is never flagged, however quiet the job) and the latest window to be slow
   (``z > release_z``), so a rank that recovers is released at its first normal window. A rank already
   flagged keeps its flag while its latest window passes ``hold`` x the one-window threshold.

Detectors keep their scoring apart from the collection (nvidia-resiliency-ext ``straggler/``, MindCluster's
slow-node detection); this one is fed numbers and can be replayed at 8,192 simulated ranks
(``benchmarks/scale_sim.py detector``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from npudist.diagnosis.straggler.student_t import round_dof, t_quantile, t_tail

__all__ = ["DetectorSettings", "StragglerDetector", "leave_one_out_median", "t_quantile", "t_tail"]

_MAD_SIGMA = 0.6744897501960817
"""median(|Z|) for a standard normal Z: a median absolute value over this is a sigma estimate."""
_MEAN_ABS = math.sqrt(2 / math.pi)
"""mean(|Z|) for a standard normal Z."""
_CHI2_1_MEDIAN = _MAD_SIGMA ** 2
"""median(Z^2) for a standard normal Z."""
_EFFICIENCY = 2 / 3 * 0.88
"""Information left in clipped absolute changes: consecutive changes share a window (lag-1 correlation
-1/2 keeps 2/3) and the clipped mean absolute value keeps 88 % of a variance estimate's efficiency."""
EXACT_UP_TO = 8
"""Up to this many ranks the reference is the others' mean and the noise their exact spread (normal theory);
above, the median and a clipped spread (robust; the degrees of freedom are large anyway)."""
LAST_SHARE = 0.7
"""Share of the false-flag budget spent on the longest evidence (L = max_windows); the rest is split over
the shorter ones, which catch gross and intermittent stragglers."""
PERSISTENT_SHARE = 0.1
"""At N = 2, the budget share of the test that learns the noise from window-to-window changes."""


@dataclass(frozen=True, kw_only=True)
class DetectorSettings:
    false_rate: float = 1e-4
    """Flagged windows per window the job may see when no rank is slow (all ranks together); the
    Bonferroni split keeps the replayed rate below it (docs/engineering/straggler.md)."""
    max_windows: int = 3
    """Evidence is accumulated over up to this many consecutive windows."""
    min_slowdown: float = 1.1
    """A rank is never flagged below this ratio to the others (geometric mean over the evidence)."""
    release_z: float = 1.0
    """A flagged rank's latest window must be at least this many noise sigmas slow to stay flagged."""
    hold: float = 0.5
    """A rank already flagged stays flagged while its latest window passes this fraction of the one-window
    threshold (hysteresis: a noisy straggler is not announced and released every other window; older
    windows do not hold it, so one false flag stays one flagged window)."""
    history: int = 512
    """Most windows the noise estimate pools (fewer once it holds ``noise_samples``)."""
    noise_samples: int = 4096
    """Noise samples the estimate pools: one window's worth at 4,098 ranks and more, ``history`` windows
    at 2 ranks."""
    min_dof: int = 3
    """Degrees of freedom of the noise estimate needed before any flag (4 ranks: 2 windows; 2 ranks: 3)."""
    noise_floor: float = 0.002
    """Smallest noise sigma assumed, in log units (0.2 %): identical timings do not make every difference
    infinitely significant."""

    def __post_init__(self) -> None:
        if not 0 < self.false_rate < 1:
            raise ValueError(f"false_rate must be in (0, 1), got {self.false_rate}")
        for name in ("max_windows", "history", "min_dof", "noise_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.min_slowdown >= 1:
            raise ValueError(f"min_slowdown must be >= 1, got {self.min_slowdown}")
        if not 0 < self.hold <= 1:
            raise ValueError(f"hold must be in (0, 1], got {self.hold}")
        if not self.noise_floor > 0:
            raise ValueError(f"noise_floor must be positive, got {self.noise_floor}")


def leave_one_out_median(values: np.ndarray) -> np.ndarray:
    """For each finite entry, the median of the *other* finite entries (NaN where there are none);
    O(N log N): removing one element shifts the middle of the sorted array by at most one place."""
    out = np.full(values.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(values))
    n = ok.size
    if n < 2:
        return out
    order = ok[np.argsort(values[ok], kind="stable")]
    s = values[order]
    pos = np.arange(n)
    m = n - 1  # size of the set without the element

    def kth(k: int) -> np.ndarray:  # k-th smallest of the others, for each removed position
        return np.where(pos <= k, s[min(k + 1, n - 1)], s[k])

    out[order] = kth(m // 2) if m % 2 else (kth(m // 2 - 1) + kth(m // 2)) / 2
    return out


@dataclass(frozen=True)
class _Window:
    """One window as the noise estimate and the evidence need it, per rank."""

    x: np.ndarray
    """Log slowdown against the others."""
    var: float
    """Var(x) / sigma^2 (n / (n - 1) for the others' mean; the median's inflation above EXACT_UP_TO)."""
    spread: np.ndarray
    """Sum of squares of the *other* ranks about their centre (sigma^2 chi^2 with ``spread_dof``)."""
    spread_dof: np.ndarray
    own: np.ndarray
    """x^2 / var (sigma^2 chi^2_1) where a rank's own past counts as noise (N = 2, not flagged), else NaN."""
    samples: float
    """Noise samples this window adds (median over ranks), for the ``noise_samples`` cap."""


def _cross_rank(logs: np.ndarray, loo_median: np.ndarray, own_history: bool) -> _Window:
    ok = np.isfinite(logs)
    n = int(ok.sum())
    nan = np.full(logs.shape, np.nan)
    if n < 2:
        return _Window(nan, 1.0, np.zeros(logs.shape), np.zeros(logs.shape), nan, 0.0)
    if n <= EXACT_UP_TO:
        r = logs - float(np.mean(logs[ok]))
        total = float(np.sum(r[ok] ** 2))
        var = n / (n - 1)
        x = r * var
        spread = np.where(ok, total - r * r * var, total)  # the others' sum of squares about their mean
    else:
        x = logs - loo_median
        var = 1 + math.pi / (2 * (n - 1))  # Var(median of n - 1) ~ pi sigma^2 / (2 (n - 1))
        r2 = (logs - float(np.median(logs[ok]))) ** 2
        med = float(np.median(r2[ok]))
        clipped = np.minimum(r2, 16 * med / _CHI2_1_MEDIAN if med > 0 else np.inf)  # 4 sigma
        total = float(np.sum(clipped[ok]))
        spread = np.where(ok, (total - clipped) * (n - 2) / (n - 1), total)
    spread = np.maximum(spread, 0.0)
    dof = np.where(ok, n - 2, n - 1).astype(float)
    own = x * x / var if own_history else nan
    return _Window(x, var, spread, dof, own, n - 2 + float(own_history))


class _ChangeNoise:
    """Sigma of x learned from its window-to-window changes (clipped mean absolute change): a constant
    slowdown does not move it. The N = 2 persistent test."""

    def __init__(self, history: int, floor: float) -> None:
        self._prev: np.ndarray | None = None
        self._changes: deque[float] = deque(maxlen=history)
        self.floor = floor

    def learn(self, x: np.ndarray) -> None:
        prev, self._prev = self._prev, x
        if prev is not None and np.isfinite(x[0] - prev[0]):
            self._changes.append(abs(float(x[0] - prev[0])))  # x_0 = -x_1: one number a window

    @property
    def dof(self) -> float:
        return _EFFICIENCY * len(self._changes)

    @property
    def sigma(self) -> float:
        if not self._changes:
            return math.nan
        d = np.asarray(self._changes)
        med = float(np.median(d))
        clip = 4 * med / _MAD_SIGMA if med > 0 else np.inf
        return max(float(np.mean(np.minimum(d, clip))) / _MEAN_ABS / math.sqrt(2), self.floor)


class StragglerDetector:
    """``update(window_means)`` once per exchange window returns the ranks flagged at that window.

    Pure and stateful: no process group, no clock, no I/O, so the same object runs in the step timer and in
    replays of 8,192 simulated ranks. ``ratios`` holds each rank's latest window mean over the median of the
    others (NaN where unknown), ``flagged`` the latest verdict, ``zscores`` the latest window in noise sigmas.
    """

    def __init__(self, world_size: int, **settings: object) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        self.world_size = world_size
        self.settings = DetectorSettings(**settings)  # type: ignore[arg-type]
        s = self.settings
        self._rows: deque[_Window] = deque()
        """Pooled windows, newest last; the last ``max_windows`` are also the evidence."""
        self._sums = np.zeros((4, world_size))
        """Over ``_rows``: spread, spread_dof, own (NaN as 0), own count."""
        self._held = 0.0
        self._persistent = _ChangeNoise(s.history, s.noise_floor) if world_size == 2 else None
        m = s.max_windows
        shares = [1.0] if m == 1 else [(1 - LAST_SHARE) / (m - 1)] * (m - 1) + [LAST_SHARE]
        main = 1 - (PERSISTENT_SHARE if self._persistent is not None else 0.0)
        self._alpha = [s.false_rate * main * share for share in shares]
        """False-flag budget of the evidence over L = 1..max_windows windows (all ranks together)."""
        self.windows = 0
        self.ratios = np.full(world_size, np.nan)
        self.zscores = np.full(world_size, np.nan)
        self.flagged: list[int] = []
        self.noise = math.nan
        """Median over ranks of the current sigma of the log slowdown (log units); NaN until learned."""

    def update(self, window_means: Sequence[float] | np.ndarray) -> list[int]:
        means = np.asarray(window_means, dtype=float)
        if means.shape != (self.world_size,):
            raise ValueError(f"expected {self.world_size} window means, got shape {means.shape}")
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.where(np.isfinite(means) & (means > 0), np.log(means), np.nan)
        loo = leave_one_out_median(logs)
        self.windows += 1
        self.ratios = np.exp(logs - loo)
        self._add(_cross_rank(logs, loo, own_history=self.world_size == 2))
        flagged = self._judge()
        if self._persistent is not None:
            self._persistent.learn(self._rows[-1].x)
            flagged |= self._judge_persistent()
        self.flagged = [int(r) for r in np.flatnonzero(flagged)]
        newest = self._rows[-1]  # a flagged window is not noise for its own rank
        self._sums -= self._terms(newest)
        newest.own[self.flagged] = np.nan
        self._sums += self._terms(newest)
        return list(self.flagged)

    @staticmethod
    def _terms(w: _Window) -> np.ndarray:
        known = np.isfinite(w.own)
        return np.array([w.spread, w.spread_dof, np.where(known, w.own, 0.0), known])

    def _add(self, row: _Window) -> None:
        s = self.settings
        self._rows.append(row)
        self._sums += self._terms(row)
        self._held += row.samples
        while len(self._rows) > s.max_windows and (
                len(self._rows) > s.history or self._held - self._rows[0].samples >= s.noise_samples):
            old = self._rows.popleft()
            self._sums -= self._terms(old)
            self._held -= old.samples

    def _threshold(self, alpha: float, dof: np.ndarray) -> np.ndarray:
        n = max(2, int(np.isfinite(self._rows[-1].x).sum()))
        lo, hi = float(np.min(dof)), float(np.max(dof))
        if lo == hi:  # every rank in every window: one quantile
            return np.full(dof.shape, t_quantile(alpha / n, round_dof(max(1.0, lo))))
        values, where = np.unique(np.nan_to_num(dof, nan=1.0), return_inverse=True)
        quantiles = np.array([t_quantile(alpha / n, round_dof(max(1.0, float(d)))) for d in values])
        return quantiles[where].reshape(dof.shape)

    def _judge(self) -> np.ndarray:
        s = self.settings
        m = min(s.max_windows, len(self._rows))
        newest_first = [self._rows[-k] for k in range(1, m + 1)]
        spread, spread_dof, own_sum, own_count = self._sums
        x = np.array([w.x for w in newest_first])
        own = np.array([w.own for w in newest_first])
        known = np.isfinite(own)
        # Row L - 1 of each: the evidence over the last L windows (NaN, a window without the rank, ends a run).
        total = np.cumsum(x, axis=0)
        squares = np.cumsum(x * x, axis=0)
        var = np.cumsum([w.var for w in newest_first])[:, None]
        length = np.arange(1, m + 1)[:, None]
        inside = (squares - total * total / length) / (var / length)  # variation inside the evidence windows
        ss = spread + own_sum - np.cumsum(np.where(known, own, 0.0), axis=0) + np.maximum(inside, 0.0)
        dof = spread_dof + own_count - np.cumsum(known, axis=0) + (length - 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            sigma = np.maximum(np.sqrt(ss / dof), s.noise_floor)
            stat = total / (sigma * np.sqrt(var))
        need = np.array([self._threshold(self._alpha[k], dof[k]) for k in range(m)])
        # A flagged rank is held by its latest window alone: one false flag stays one flagged window.
        need[0, self.flagged] *= s.hold
        mature = dof >= s.min_dof
        self.zscores = np.where(mature[0], stat[0], np.nan)
        seen = sigma[0][np.isfinite(x[0]) & (dof[0] > 0)]
        self.noise = float(np.median(seen)) if seen.size else math.nan
        with np.errstate(invalid="ignore"):
            evidence = (mature & (stat > need) & (total / length >= math.log(s.min_slowdown))).any(axis=0)
            return evidence & (self.zscores > s.release_z)

    def _judge_persistent(self) -> np.ndarray:
        """Two ranks: the evidence of the last ``max_windows`` windows against the noise of window-to-window
        changes (Bonferroni share PERSISTENT_SHARE)."""
        s, p = self.settings, self._persistent
        assert p is not None
        out = np.zeros(self.world_size, dtype=bool)
        sigma = p.sigma
        if not math.isfinite(sigma) or p.dof < s.min_dof:
            return out
        rows = [self._rows[-k] for k in range(min(s.max_windows, len(self._rows)), 0, -1)]
        # All of its share on the longest evidence: a slowdown present from the start is constant.
        need = t_quantile(s.false_rate * PERSISTENT_SHARE / 2, round_dof(p.dof))
        need_r = np.where(np.isin(np.arange(2), self.flagged), s.hold * need, need)
        total = np.sum([w.x for w in rows], axis=0)
        with np.errstate(invalid="ignore"):
            out |= (total / (sigma * math.sqrt(len(rows))) > need_r) & (total / len(rows) >= math.log(s.min_slowdown))
        with np.errstate(invalid="ignore"):
            return out & (rows[-1].x / sigma > s.release_z)
