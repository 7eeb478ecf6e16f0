"""The best detection rate any rule can reach at 2 ranks: a 1.3x rank flagged within 3 windows of its onset,
after ``--history`` windows without it, at a false-window target.

    python benchmarks/scale_sim.py bound [--history 10] [--alpha 1e-4,3e-5] [--slowdown 1.3] [--noise 0.05]

Model (the replay's, benchmarks/scale_sim.py): each rank's window mean is lognormal with sigma ``noise``;
at 2 ranks a rule sees only d_w = log(mean_0 / mean_1) ~ N(0, 2 sigma^2), and from window h + 1 on
N(+-delta, 2 sigma^2) (delta = log slowdown, the slow rank unknown). A rule that holds the false-window
target alpha whatever the noise level must not depend on the scale of d; the scale group is amenable, so by
the Hunt-Stein theorem such (invariant) rules lose nothing in worst-case power over noise levels. The
maximal invariant of d_1..d_w is its direction, and its likelihood ratio depends only on the cosine c_w
between d_1..d_w and the onset direction (0, .., 0, 1, .., 1): with k onset windows, n = h + k,
M = delta sqrt(k) / (sigma sqrt 2) and J_n(a) = int_0^inf r^(n-1) exp(-r^2/2 + a r) dr,

    Lambda_k(c) = exp(-M^2/2) (J_n(c M) + J_n(-c M)) / (2 J_n(0)).

Under no slowdown, c moves as a Markov chain: with theta drawn with density ~ cos^(n-1), the next cosine
is (c sqrt(k) cos theta + sin theta) / sqrt(k + 1). A rule that flags within windows h+1..h+3 (stopping
time tau) with P0(flag at w) <= alpha at each w has, for any mu_w >= 0 (weak Lagrange duality),

    P1(tau <= h+3) <= E0[ max over tau of (Lambda_tau(c_tau) - mu_tau) ] + alpha (mu_1 + mu_2 + mu_3),

and the inner maximum is an optimal-stopping problem solved by backward induction on a grid of c. The
bound printed is the minimum over mu (coordinate search; the dual is convex in mu). It ignores the false
flags a rule must also avoid at other windows and whether it names the right rank, so no rule does better.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

import numpy as np


def _log_j(n: int, a: np.ndarray) -> np.ndarray:
    """log J_n(a) by the trapezoid rule (the integrand peaks below r = a + sqrt(n) + 10 < 40 here)."""
    r = np.linspace(0.0, 40.0, 8001)
    lg = (n - 1) * np.log(np.maximum(r, 1e-300))[None] - r[None] ** 2 / 2 + a[:, None] * r[None]
    top = lg.max(axis=1, keepdims=True)
    return top[:, 0] + np.log(np.trapezoid(np.exp(lg - top), r, axis=1))


def likelihood_ratio(n: int, k: int, lam: float, c: np.ndarray) -> np.ndarray:
    """Lambda_k(c): the invariant's likelihood ratio after n windows, k of them slow; lam = delta / (sigma sqrt 2)."""
    m = lam * math.sqrt(k)
    zero = _log_j(n, np.zeros(1))[0]
    return np.exp(-m * m / 2 + np.logaddexp(_log_j(n, c * m), _log_j(n, -c * m)) - math.log(2) - zero)


def bound(lam: float, history: int, alpha: float, within: int = 3, grid: int = 1201,
          angles: int = 4001) -> tuple[float, np.ndarray]:
    """(the detection bound, the multipliers mu that give it)."""
    c = np.linspace(-1.0, 1.0, grid)
    theta = np.linspace(-math.pi / 2, math.pi / 2, angles)[1:-1]
    ratios = [likelihood_ratio(history + k, k, lam, c) for k in range(1, within + 1)]

    def weights(n: int) -> np.ndarray:
        w = np.cos(theta) ** (n - 1)
        return w / w.sum()

    def expect_next(v: np.ndarray, k: int) -> np.ndarray:  # E0[v(c') | c] after history + k windows
        nxt = (c[:, None] * math.sqrt(k) * np.cos(theta)[None] + np.sin(theta)[None]) / math.sqrt(k + 1)
        return (np.interp(nxt, c, v) * weights(history + k)[None]).sum(axis=1)

    def dual(mu: np.ndarray) -> float:
        v = np.maximum(0.0, ratios[-1] - mu[-1])
        for k in range(within - 1, 0, -1):
            v = np.maximum(ratios[k - 1] - mu[k - 1], expect_next(v, k))
        first = float((np.interp(np.sin(theta), c, v) * weights(history)).sum())
        return first + alpha * float(mu.sum())

    x = np.full(within, math.log(1e3))
    best = dual(np.exp(x))
    step = 2.0
    while step > 1e-3:
        moved = False
        for i in range(within):
            for s in (step, -step):
                y = x.copy()
                y[i] += s
                val = dual(np.exp(y))
                if val < best:
                    x, best, moved = y, val, True
        if not moved:
            step /= 2
    return min(1.0, best), np.exp(x)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--history", type=int, default=10, help="windows without the slow rank before its onset")
    p.add_argument("--alpha", default="1e-4,3e-5", help="false-window targets (flagged windows per window)")
    p.add_argument("--slowdown", type=float, default=1.3)
    p.add_argument("--noise", type=float, default=0.05, help="sigma of each rank's log window mean")
    args = p.parse_args(argv)
    lam = math.log(args.slowdown) / (args.noise * math.sqrt(2))
    print(f"# 2 ranks, {args.slowdown}x rank after {args.history} windows, noise {args.noise:.0%}: the best any "
          "scale-invariant rule can do, flagged within 3 windows")
    print("| false-window target | bound |")
    print("|---|---|")
    for alpha in (float(a) for a in args.alpha.split(",") if a):
        value, _ = bound(lam, args.history, alpha)
        print(f"| {alpha:g} | {100 * value:.1f} % |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
