"""Line charts as inline SVG text: no plotting library, no script, nothing fetched, so the page works offline.

Pure functions from numbers to markup; every piece of text goes through html.escape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from npudist.report.model import Series

# Colour-blind-safe palette (Okabe & Ito, "Color Universal Design"), cycled per series.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
_MARGIN_L, _MARGIN_R, _MARGIN_T, _MARGIN_B = 70, 20, 20, 50


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError("tick range must be finite")
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(target - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = [round(first, 12)]
    while ticks[-1] < hi:  # the last tick is the first at or above hi, so no point lies outside the axes
        ticks.append(round(first + len(ticks) * step, 12))
    return ticks


def size_label(n: float) -> str:
    """Bytes with binary suffixes as nccl-tests sizes are given: 1024 -> 1K, 67108864 -> 64M."""
    for suffix, unit in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= unit and n % unit == 0:
            return f"{int(n // unit)}{suffix}"
    return f"{n:g}"


def number_label(v: float) -> str:
    return f"{v:.4g}"


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str, log2_x: bool = False,
               y_from_zero: bool = False, width: int = 720, height: int = 320, plot_id: str = "") -> str:
    """An <svg> with axes, ticks, one polyline (and point markers) per series, and a legend below it."""
    points = [p for s in series for p in s.points if not log2_x or p[0] > 0]
    if not points:
        raise ValueError(f"chart {title!r} has no points to draw")

    def xv(x: float) -> float:
        return math.log2(x) if log2_x else x

    xs = [xv(x) for x, _ in points]
    ys = [y for _, y in points]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    if log2_x:
        x_ticks = [float(k) for k in range(math.floor(x_lo), math.ceil(x_hi) + 1)]
        if len(x_ticks) > 12:  # keep labels readable: every other power of two
            x_ticks = x_ticks[::2]
    else:
        x_ticks = nice_ticks(x_lo, x_hi)
    y_ticks = nice_ticks(min(0.0, min(ys)) if y_from_zero else min(ys), max(ys))
    x_lo, x_hi = min(x_lo, x_ticks[0]), max(x_hi, x_ticks[-1])
    y_lo, y_hi = y_ticks[0], y_ticks[-1]
    if y_hi == y_lo:
        y_hi = y_lo + 1
    pw, ph = width - _MARGIN_L - _MARGIN_R, height - _MARGIN_T - _MARGIN_B

    def px(x: float) -> float:
        return _MARGIN_L + (xv(x) - x_lo) / (x_hi - x_lo) * pw

    def py(y: float) -> float:
        return _MARGIN_T + ph - (y - y_lo) / (y_hi - y_lo) * ph

    legend_rows = math.ceil(len(series) / 2)
    total_h = height + 18 * legend_rows + 6
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width}" height="{total_h}" '
           f'viewBox="0 0 {width} {total_h}" data-plot="{escape(plot_id)}" data-series="{len(series)}">',
           f"<title>{escape(title)}</title>",
           f'<rect x="{_MARGIN_L}" y="{_MARGIN_T}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>']
    for t in x_ticks:
        x = _MARGIN_L + (t - x_lo) / (x_hi - x_lo) * pw
        label = size_label(2**t) if log2_x else number_label(t)
        out.append(f'<line x1="{x:.1f}" y1="{_MARGIN_T}" x2="{x:.1f}" y2="{_MARGIN_T + ph}" stroke="#e3e3e3"/>'
                   f'<text x="{x:.1f}" y="{_MARGIN_T + ph + 16}" text-anchor="middle" font-size="11">'
                   f"{escape(label)}</text>")
    for t in y_ticks:
        y = py(t)
        out.append(f'<line x1="{_MARGIN_L}" y1="{y:.1f}" x2="{_MARGIN_L + pw}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                   f'<text x="{_MARGIN_L - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">'
                   f"{escape(number_label(t))}</text>")
    out.append(f'<text x="{_MARGIN_L + pw / 2:.1f}" y="{_MARGIN_T + ph + 36}" text-anchor="middle" '
               f'font-size="12">{escape(x_label)}</text>')
    out.append(f'<text x="14" y="{_MARGIN_T + ph / 2:.1f}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 14 {_MARGIN_T + ph / 2:.1f})">{escape(y_label)}</text>')
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        pts = [(px(x), py(y)) for x, y in s.points if not log2_x or x > 0]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        out.append(f'<g class="series" data-name="{escape(s.name)}"><title>{escape(s.name)}</title>'
                   f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}"/>')
        if len(pts) <= 60:
            out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>' for x, y in pts]
        out.append("</g>")
        lx = _MARGIN_L + (i % 2) * (pw / 2)
        ly = height + 4 + 18 * (i // 2)
        out.append(f'<rect x="{lx:.1f}" y="{ly}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{lx + 18:.1f}" y="{ly + 10}" font-size="12">{escape(s.name)}</text>')
    out.append("</svg>")
    return "\n".join(out)
