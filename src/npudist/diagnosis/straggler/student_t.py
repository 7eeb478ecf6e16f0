"""Student's t tail and quantile without scipy: the detector's thresholds for a noise learned from few samples."""

from __future__ import annotations

import math
from functools import lru_cache


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


def round_dof(nu: float) -> float:
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
