"""Line charts as inline SVG text: no plotting library, no script, nothing fetched, so the page works offline.

Pure functions from numbers to markup; every piece of text goes through html.escape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import ROUND_FLOOR, Context, Decimal
from html import escape

from npudist.report.model import Series

# Colour-blind-safe palette (Okabe & Ito, "Color Universal Design"), cycled per series.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
_MARGIN_L, _MARGIN_R, _MARGIN_T, _MARGIN_B = 70, 20, 20, 50
_MAX_X_TICKS = 12
# Axis arithmetic is decimal: any finite float64 range (1e-320 wide, or -1.7e308..1.7e308) has a span, round
# ticks and pixel positions without overflow, underflow or a tick loop that float rounding stalls.
_DEC = Context(prec=34, Emax=999_999, Emin=-999_999)


def nice_ticks(lo: float | Decimal, hi: float | Decimal, target: int = 6) -> list[Decimal]:
    """Round tick values (1, 2 or 5 times a power of ten) covering [lo, hi]; the last is the first at or
    above hi, so no point lies outside the axes."""
    lo, hi = Decimal(lo), Decimal(hi)
    if not (lo.is_finite() and hi.is_finite()):
        raise ValueError("tick range must be finite")
    if hi <= lo:
        hi = _DEC.add(lo, abs(lo) or Decimal(1))
    raw = _DEC.divide(_DEC.subtract(hi, lo), target - 1)
    power = Decimal(1).scaleb(raw.adjusted(), _DEC)
    step = next(p for m in (1, 2, 5, 10) if (p := _DEC.multiply(power, m)) >= raw)
    first = _DEC.multiply(_DEC.divide(lo, step).to_integral_value(ROUND_FLOOR, _DEC), step)
    ticks = [first]
    while ticks[-1] < hi and len(ticks) <= 2 * target + 2:
        ticks.append(_DEC.add(first, _DEC.multiply(step, len(ticks))))
    return ticks


def size_label(n: float) -> str:
    """Bytes with binary suffixes as nccl-tests sizes are given: 1024 -> 1K, 67108864 -> 64M."""
    for suffix, unit in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= unit and n % unit == 0:
            return f"{Decimal(n) / unit:.6g}{suffix}"
    return f"{Decimal(n):.6g}"


_SI = (("T", Decimal(10) ** 12), ("G", Decimal(10) ** 9), ("M", Decimal(10) ** 6), ("k", Decimal(1000)))


def number_label(v: Decimal | float, step: Decimal | None = None) -> str:
    """A tick label as people write it: 20, 40; 2k, 4.5k, 1M; 0.05; 1e-05 only where nothing shorter reads.

    Enough significant digits that ticks ``step`` apart read differently (4 at least).
    """
    v = Decimal(v)
    if v == 0:
        return "0"
    digits = 4
    if step is not None:
        digits = min(17, max(4, v.adjusted() - step.adjusted() + 1))
    for suffix, unit in _SI:
        if abs(v) >= unit and v.adjusted() < 15:
            return _plain(_DEC.divide(v, unit), digits) + suffix
    if v.adjusted() >= 15 or v.adjusted() < -4:
        return f"{v.normalize(_DEC):.{digits}g}"
    return _plain(v, digits)


def _plain(v: Decimal, digits: int) -> str:
    """Fixed-point with at most ``digits`` significant digits and no trailing zeros (never an exponent)."""
    q = Decimal(1).scaleb(v.adjusted() - digits + 1)
    text = format(v.quantize(q, context=_DEC) if q < 1 else v.to_integral_value(context=_DEC), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


class _Axis:
    """One axis: ticks covering the data, and each value's position along it."""

    def __init__(self, lo: float, hi: float, *, from_zero: bool = False, integer_ticks: bool = False) -> None:
        d_lo, d_hi = Decimal(min(lo, 0.0) if from_zero else lo), Decimal(hi)
        if integer_ticks:  # log2 axes: one tick per power of two, thinned to stay readable
            first, last = math.floor(lo), math.ceil(hi)
            if first == last:
                first, last = first - 1, last + 1
                d_lo, d_hi = Decimal(first), Decimal(last)
            stride = max(1, math.ceil((last - first + 1) / _MAX_X_TICKS))
            self.ticks = [Decimal(k) for k in range(first, last + stride, stride)]
            self.step = Decimal(stride)
        else:
            if d_hi == d_lo:  # a flat line: from zero, 0 to 1 (a ratio axis never goes below 0)
                d_lo, d_hi = (d_lo, _DEC.add(d_hi, 1)) if from_zero and d_lo >= 0 else \
                    (_DEC.subtract(d_lo, 1), _DEC.add(d_hi, 1))
            self.ticks = nice_ticks(d_lo, d_hi)
            self.step = _DEC.subtract(self.ticks[1], self.ticks[0]) if len(self.ticks) > 1 else Decimal(1)
        self.lo, self.hi = min(d_lo, self.ticks[0]), max(d_hi, self.ticks[-1])
        if self.hi == self.lo:
            self.hi = _DEC.add(self.lo, 1)

    def frac(self, v: float | Decimal) -> float:
        """0 at the axis start, 1 at its end."""
        return float(_DEC.divide(_DEC.subtract(Decimal(v), self.lo), _DEC.subtract(self.hi, self.lo)))


class _LogAxis:
    """A base-10 log axis (``_Axis``'s interface, values not logarithms): ticks at 1, 2 and 5 times powers of
    ten, only the powers once the data spans more than 2 decades, thinned to at most ``_MAX_X_TICKS``."""

    def __init__(self, lo: float, hi: float) -> None:
        first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        mults = (1, 2, 5) if last - first <= 2 else (1,)
        stride = max(1, math.ceil((last - first + 1) / _MAX_X_TICKS))
        marks = [Decimal(m).scaleb(k) for k in range(first, last + 1, stride) for m in mults]
        below = [t for t in marks if t <= Decimal(lo)] or marks[:1]
        above = [t for t in marks if t >= Decimal(hi)] or [Decimal(1).scaleb(last + stride)]
        self.lo, self.hi = below[-1], above[0]
        if self.hi == self.lo:  # every value is one tick: a decade around it
            self.lo, self.hi = self.lo.scaleb(-1), self.hi.scaleb(1)
        self.ticks = sorted({t for t in [self.lo, *marks, self.hi] if self.lo <= t <= self.hi})
        self.step = None

    def frac(self, v: float | Decimal) -> float:
        """0 at the axis start, 1 at its end, by logarithm."""
        return (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str, log2_x: bool = False,
               y_from_zero: bool = False, width: int = 720, height: int = 320, plot_id: str = "",
               threshold: float | None = None, y_max: float | None = None, log_y: bool = False) -> str:
    """An <svg> with axes, ticks, one polyline (and point markers) per series, and a legend below it.

    ``threshold`` draws a dashed horizontal line (kept inside the y axis); ``y_max`` caps the y axis (ratios
    end at 1) unless a point lies above it; ``log_y`` spaces the y axis by powers of ten (positive values only).
    """
    points = [p for s in series for p in s.points if not log2_x or p[0] > 0]
    if not points:
        raise ValueError(f"chart {title!r} has no points to draw")
    if not all(math.isfinite(x) and math.isfinite(y) for x, y in points):
        raise ValueError(f"chart {title!r} has a non-finite point; series hold finite values only")
    if log_y and (y_from_zero or threshold is not None or y_max is not None or min(y for _, y in points) <= 0):
        raise ValueError(f"chart {title!r}: a log y axis needs positive values and no zero, threshold or cap")

    def xv(x: float) -> float:
        return math.log2(x) if log2_x else x

    xs = [xv(x) for x, _ in points]
    ys = [y for _, y in points]
    pw, ph = width - _MARGIN_L - _MARGIN_R, height - _MARGIN_T - _MARGIN_B
    x_axis = _Axis(min(xs), max(xs), integer_ticks=log2_x)
    y_hi = max(ys) if threshold is None else max(*ys, threshold)
    y_axis: _Axis | _LogAxis = _LogAxis(min(ys), y_hi) if log_y else _Axis(min(ys), y_hi, from_zero=y_from_zero)
    if y_max is not None and y_hi <= y_max:
        y_axis.ticks = [t for t in y_axis.ticks if t <= Decimal(y_max)]
        if y_axis.ticks[-1] < Decimal(y_max):
            y_axis.ticks.append(Decimal(y_max))
        y_axis.hi = Decimal(y_max)

    def px(x: float) -> float:
        return _MARGIN_L + x_axis.frac(xv(x)) * pw

    def py(y: float | Decimal) -> float:
        return _MARGIN_T + ph - y_axis.frac(y) * ph

    legend_rows = math.ceil(len(series) / 2)
    total_h = height + 18 * legend_rows + 6
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width}" height="{total_h}" '
           f'viewBox="0 0 {width} {total_h}" data-plot="{escape(plot_id)}" data-series="{len(series)}">',
           f"<title>{escape(title)}</title>",
           f'<rect x="{_MARGIN_L}" y="{_MARGIN_T}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>']
    for t in x_axis.ticks:
        x = _MARGIN_L + x_axis.frac(t) * pw
        label = size_label(2 ** int(t)) if log2_x else number_label(t, x_axis.step)
        out.append(f'<line x1="{x:.1f}" y1="{_MARGIN_T}" x2="{x:.1f}" y2="{_MARGIN_T + ph}" stroke="#e3e3e3"/>'
                   f'<text x="{x:.1f}" y="{_MARGIN_T + ph + 16}" text-anchor="middle" font-size="11">'
                   f"{escape(label)}</text>")
    for t in y_axis.ticks:
        y = py(t)
        out.append(f'<line x1="{_MARGIN_L}" y1="{y:.1f}" x2="{_MARGIN_L + pw}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                   f'<text x="{_MARGIN_L - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">'
                   f"{escape(number_label(t, y_axis.step))}</text>")
    if threshold is not None:
        y = py(threshold)
        out.append(f'<line class="threshold" x1="{_MARGIN_L}" y1="{y:.1f}" x2="{_MARGIN_L + pw}" y2="{y:.1f}" '
                   f'stroke="#c00" stroke-dasharray="6 4" stroke-width="1.5"/>'
                   f'<text x="{_MARGIN_L + pw - 4}" y="{y - 4:.1f}" text-anchor="end" font-size="11" fill="#c00">'
                   f"threshold {escape(number_label(threshold))}</text>")
    out.append(f'<text x="{_MARGIN_L + pw / 2:.1f}" y="{_MARGIN_T + ph + 36}" text-anchor="middle" '
               f'font-size="12">{escape(x_label)}</text>')
    out.append(f'<text x="14" y="{_MARGIN_T + ph / 2:.1f}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 14 {_MARGIN_T + ph / 2:.1f})">{escape(y_label)}</text>')
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        shown = [(x, y) for x, y in s.points if not log2_x or x > 0]
        pts = [(px(x), py(y)) for x, y in shown]
        out.append(f'<g class="series" data-name="{escape(s.name)}"><title>{escape(s.name)}</title>')
        for run in _runs(shown, s.breaks):
            coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in run)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}"/>')
        if len(pts) <= 60:
            out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>' for x, y in pts]
        out.append("</g>")
        lx = _MARGIN_L + (i % 2) * (pw / 2)
        ly = height + 4 + 18 * (i // 2)
        out.append(f'<rect x="{lx:.1f}" y="{ly}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{lx + 18:.1f}" y="{ly + 10}" font-size="12">{escape(s.name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _runs(points: Sequence[tuple[float, float]], breaks: Sequence[float]) -> list[list[tuple[float, float]]]:
    """The points cut where a break (a resumed segment's start) lies between two of them."""
    runs: list[list[tuple[float, float]]] = []
    for p in points:
        if not runs or any(runs[-1][-1][0] < b <= p[0] for b in breaks):
            runs.append([])
        runs[-1].append(p)
    return runs
