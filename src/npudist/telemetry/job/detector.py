"""Straggler detection whose sensitivity does not depend on the world size: a pure, stateful detector.

Each window every rank reports its mean *work* time (seconds; NaN = the rank sent nothing). The detector
judges each rank against the others, never against a job-wide spread (stddev/mean dilutes as 1/sqrt(N) when
one rank among N is slow):

1. ``x_i = log(mean_i) - median_{j != i} log(mean_j)``: the rank's log slowdown against the median of the
   *other* ranks, so a slow rank does not drag its own reference (at N = 2 the reference is the peer).
2. The noise of ``x`` is learned from the data, from the window-to-window changes of every rank's ``x``
   (a rank that is slow all along does not inflate it; one onset is one value among many). It is pooled
   over ranks and over the last ``history`` windows, so a large job learns it in one window and a 2-rank
   job in a few tens (see ``noise_dof``); the threshold is a Student-t quantile with that many degrees of
   freedom, so a young estimate widens it instead of raising false flags.
3. Evidence accumulates over the last L = 1..``max_windows`` windows (a windowed CUSUM / GLR scan):
   ``sum(x) / (sigma * sqrt(L))`` must pass a threshold set so that the *job* sees at most ``false_rate``
   flagged windows per window whatever N is (Bonferroni over ranks and L: one slow rank among 8,192 costs
   only ~1.5 sigma more than among 2, and its evidence grows as sqrt(L)).
4. A flag also needs the mean slowdown over those L windows to reach ``min_slowdown`` (a 3 % difference
   that is real but harmless is never flagged, however quiet the job) and the latest window to be slow
   (``z > release_z``), so a rank that recovers is released at its first normal window. A rank already
   flagged keeps its flag on ``hold`` x the threshold, so a noisy straggler is not announced and released
   every other window.

Ramp (thermal throttling): a rank whose step time creeps up is flagged once its slowdown over the last
few windows passes ``min_slowdown`` with enough evidence; a slow ramp barely moves the learned noise (it
is a small change per window). Intermittent slowness: a rank slow in isolated windows is flagged in a
slow window only when that window alone, or the run of slow windows ending there, is conclusive; it is
released at each normal window. ``benchmarks/scale_sim.py detector`` measures both.

Detectors keep their scoring apart from the collection (nvidia-resiliency-ext ``straggler/``, MindCluster's
slow-node detection); this one is fed numbers and can be replayed at 8,192 simulated ranks.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

_MAD_SIGMA = 0.6744897501960817
"""median(|Z|) for a standard normal Z: a median absolute value over this is a sigma estimate."""
_MEAN_ABS = math.sqrt(2 / math.pi)
"""mean(|Z|) for a standard normal Z."""
_EFFICIENCY = 2 / 3 * 0.88


@dataclass(frozen=True, kw_only=True)
class DetectorSettings:
    false_rate: float = 3e-5
    """Flagged windows per window the job may see when no rank is slow (all ranks together)."""
    max_windows: int = 3
    """Evidence is accumulated over up to this many consecutive windows."""
    min_slowdown: float = 1.1
    """A rank is never flagged below this ratio to the median of the others (mean over the evidence)."""
    release_z: float = 1.0
    """A flagged rank's latest window must be at least this many noise sigmas slow to stay flagged."""
    hold: float = 0.5
    """A rank already flagged stays flagged while its evidence passes this fraction of the threshold
    (hysteresis: a noisy straggler is not announced and released every other window)."""
    history: int = 512
    """Most windows the noise estimate pools (fewer once it holds ``noise_samples``)."""
    noise_samples: int = 4096
    """Window-to-window changes the noise estimate pools: one window's worth at 4,097 ranks and more,
    ``history`` windows at 2 ranks."""
    min_dof: int = 3
    """Effective noise samples needed before any flag (a 2-rank job: 7 windows); until the estimate
    matures the t quantile keeps only gross stragglers flaggable."""
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


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Numerical Recipes 6.4, modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def t_tail(t: float, nu: float) -> float:
    """P(T > t) for Student's t with ``nu`` degrees of freedom, t >= 0: I_{nu/(nu+t^2)}(nu/2, 1/2) / 2."""
    x, a, b = nu / (nu + t * t), nu / 2, 0.5
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a / 2
    return (1.0 - front * _betacf(b, a, 1.0 - x) / b) / 2


def _grid(nu: float) -> float:
    """``nu`` rounded down to whole numbers up to 32, then to steps of 10 % (at most 1e4): a few dozen values,
    so the quantile cache stays small; rounding down only widens the threshold."""
    if nu < 32:
        return float(max(1, math.floor(nu)))
    return min(1e4, 32 * 1.1 ** math.floor(math.log(nu / 32) / math.log(1.1)))


@lru_cache(maxsize=1024)
def t_quantile(p: float, nu: float) -> float:
    """The t with P(T > t) = p (0 < p < 1/2), by bisection on t_tail."""
    lo, hi = 0.0, 1.0
    while t_tail(hi, nu) > p:
        lo, hi = hi, hi * 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_tail(mid, nu) > p else (lo, mid)
        if hi - lo < 1e-9 * hi:
            break
    return (lo + hi) / 2


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


class StragglerDetector:
    """``update(window_means)`` once per exchange window returns the ranks flagged at that window.

    Pure and stateful: no process group, no clock, no I/O, so the same object runs in the step timer and in
    replays of 8,192 simulated ranks. ``ratios`` holds each rank's latest window mean over the median of the
    others (NaN where unknown), ``flagged`` the latest verdict.
    """

    def __init__(self, world_size: int, **settings: object) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        self.world_size = world_size
        self.settings = DetectorSettings(**settings)  # type: ignore[arg-type]
        s = self.settings
        self._x = np.full((s.max_windows, world_size), np.nan)
        """Ring of the last max_windows log slowdowns, newest at ``self._at``."""
        self._at = -1
        self._prev: np.ndarray | None = None
        self._changes: deque[np.ndarray] = deque(maxlen=s.history)
        self._dofs: deque[int] = deque(maxlen=s.history)
        self.windows = 0
        self.ratios = np.full(world_size, np.nan)
        self.zscores = np.full(world_size, np.nan)
        self.flagged: list[int] = []
        self.noise = math.nan
        """Current sigma of the log slowdown (log units); NaN until learned."""

    @property
    def noise_dof(self) -> float:
        """Effective independent samples behind the noise estimate: the changes of one rank in consecutive
        windows share a window (lag-1 correlation -1/2, which leaves 2/3 of the information in their squares)
        and the clipped mean absolute change keeps 88 % of a variance estimate's efficiency."""
        return _EFFICIENCY * sum(self._dofs)

    def threshold(self, ranks: int | None = None) -> float:
        """Evidence (in sigmas of a sum over L windows) a rank needs with the noise known as well as now."""
        s = self.settings
        n = max(2, ranks if ranks is not None else self.world_size)
        return t_quantile(s.false_rate / (n * s.max_windows), _grid(self.noise_dof))

    def update(self, window_means: Sequence[float] | np.ndarray) -> list[int]:
        means = np.asarray(window_means, dtype=float)
        if means.shape != (self.world_size,):
            raise ValueError(f"expected {self.world_size} window means, got shape {means.shape}")
        s = self.settings
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.where(np.isfinite(means) & (means > 0), np.log(means), np.nan)
        x = logs - leave_one_out_median(logs)
        self.windows += 1
        self.ratios = np.exp(x)
        self._learn_noise(x)
        self._at = (self._at + 1) % s.max_windows
        self._x[self._at] = x
        self.noise = self._sigma()
        if not math.isfinite(self.noise) or self.noise_dof < s.min_dof:
            self.zscores = np.full(self.world_size, np.nan)
            self.flagged = []
            return []
        ranks = int(np.isfinite(x).sum())
        self.zscores = x / self.noise
        self.flagged = self._judge(self.threshold(ranks))
        return list(self.flagged)

    def _learn_noise(self, x: np.ndarray) -> None:
        prev, self._prev = self._prev, x
        if prev is None:
            return
        d = np.abs(x - prev)
        d = d[np.isfinite(d)]
        if d.size == 0:
            return
        cap = self.settings.noise_samples
        stride = max(1, math.ceil(d.size / cap))
        self._changes.append(d[::stride])
        # With two ranks the two changes are one number (x_0 = -x_1); in general N ranks carry N - 1.
        self._dofs.append(max(1, min(d.size - 1, cap)))
        while len(self._changes) > 1 and sum(c.size for c in self._changes) - self._changes[0].size >= cap:
            self._changes.popleft()
            self._dofs.popleft()

    def _sigma(self) -> float:
        if not self._changes:
            return math.nan
        d = np.concatenate(self._changes)
        med = float(np.median(d))
        # Mean absolute change, clipped at ~4 sigma by the median so a few jumps (a rank turning slow) do not
        # inflate it; more efficient than the median alone (88 % vs 37 %), which matters at 2 ranks.
        clip = 4 * med / _MAD_SIGMA if med > 0 else np.inf
        sigma_change = float(np.mean(np.minimum(d, clip))) / _MEAN_ABS
        return max(sigma_change / math.sqrt(2), self.settings.noise_floor)

    def _judge(self, threshold: float) -> list[int]:
        s = self.settings
        order = [(self._at - k) % s.max_windows for k in range(s.max_windows)]
        recent = self._x[order]  # newest first
        latest = recent[0]
        evidence = np.zeros(self.world_size, dtype=bool)
        total = np.zeros(self.world_size)
        min_log = math.log(s.min_slowdown)
        needed = np.full(self.world_size, threshold)
        needed[self.flagged] *= s.hold
        for length in range(1, min(s.max_windows, self.windows) + 1):
            total = total + recent[length - 1]  # NaN (a window without this rank) ends its run
            stat = total / (self.noise * math.sqrt(length))
            with np.errstate(invalid="ignore"):
                evidence |= (stat > needed) & (total / length >= min_log)
        with np.errstate(invalid="ignore"):
            flagged = evidence & (latest / self.noise > s.release_z)
        return [int(r) for r in np.flatnonzero(flagged)]
