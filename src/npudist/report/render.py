"""ReportData -> one self-contained HTML page (inline CSS and SVG, no script, no external resource).

The loss chart's smoothing and log-scale toggles are checkboxes that CSS alone reads: each combination is
drawn beforehand and the checked boxes pick the one shown, so the page needs no script (its CSP allows none).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path
from types import MappingProxyType
from typing import Any

from npudist.report import verdicts
from npudist.report.model import DEVICE_PLOTS, LOSS_SMOOTHING, WORST_WINDOWS, ReportData, Series, smoothed
from npudist.report.records import RunFile
from npudist.report.svg import line_chart, number_label
from npudist.report.times import utc_time

_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 980px; color: #222; }
.aborted { border: 2px solid #b00020; background: #fff0f0; padding: 8px 12px; margin: 8px 0; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; } th { background: #f0f0f0; }
td.l, th.l { text-align: left; }
.not-recorded { color: #8a5a00; background: #fff6e0; padding: 6px 10px; border-left: 4px solid #e6a700; }
.problems { color: #8b0000; }
figure { margin: 8px 0; }
.card { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; background: #f5f8fc;
        border: 1px solid #c9d6e6; padding: 10px 14px; font-size: 14px; margin: 8px 0 16px; }
.card dt { color: #555; } .card dd { margin: 0; font-weight: 600; word-break: break-all; }
.value { font-size: 20px; font-weight: 600; }
.toggles { font-size: 13px; margin-right: 14px; } .variant { display: none; }
.t-smooth:not(:checked) ~ .t-log:not(:checked) ~ .variants > .v-raw-linear,
.t-smooth:not(:checked) ~ .t-log:checked ~ .variants > .v-raw-log,
.t-smooth:checked ~ .t-log:not(:checked) ~ .variants > .v-smooth-linear,
.t-smooth:checked ~ .t-log:checked ~ .variants > .v-smooth-log { display: block; }
"""

NOT_RECORDED = MappingProxyType({
    "loss": "Run the job with a run directory (examples/train_ddp.py --run-dir RUN_DIR) so each rank writes "
            "metrics/rank{R}.jsonl.",
    "step_time": "Step times come from the StepTimer; the job ran with --no-telemetry or logged no steps.",
    "skew": "Skew is exchanged every 20 steps by the StepTimer (needs at least 20 steps and telemetry on).",
    "work_time": "Work times come with the skew windows the StepTimer exchanges every 20 steps (telemetry on).",
    "phases": "Phases come with the skew windows the StepTimer exchanges every 20 steps (telemetry on; "
              "npudist >= the live phases of issue 44).",
    "comm": "Collective totals are written when the job ends (RunLog.close()); the job did not end cleanly "
            "or logged nothing.",
    "bench": "Save a benchmark into the run: npudist bench collective --out RUN_DIR/bench/all_reduce.json",
    "device": "No device source gave readings (utilization, power, temperature, memory) for this run.",
})


def _not_recorded(key: str) -> str:
    return f'<p class="not-recorded" data-missing="{key}">Not recorded. {escape(NOT_RECORDED[key])}</p>'


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{escape(h)}</th>' for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{escape(c)}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _chart(series: Sequence[Series], plot_id: str, title: str, x_label: str, y_label: str, **kw: Any) -> str:
    """A chart, or, when every series has a single sample, the values themselves: one point on axes says less."""
    if all(len(x.points) == 1 for x in series):
        rows = "".join(f'<li>{escape(x.name)}: <span class="value">{escape(number_label(x.points[0][1]))}</span> '
                       f"at {escape(x_label)} {escape(number_label(x.points[0][0]))}</li>" for x in series)
        return (f'<div class="single" id="plot-{escape(plot_id)}" data-plot="{escape(plot_id)}">'
                f"<p>{escape(y_label)}: one sample</p><ul>{rows}</ul></div>")
    svg = line_chart(series, title=title, x_label=x_label, y_label=y_label, plot_id=plot_id, **kw)
    return f'<figure class="plot" id="plot-{escape(plot_id)}">{svg}</figure>'


def _section(key: str, heading: str, body: str) -> str:
    return f'<section id="{key}"><h2>{escape(heading)}</h2>{body}</section>'


def _loss(data: ReportData) -> str:
    if not data.loss:
        return _not_recorded("loss")
    if all(len(x.points) == 1 for x in data.loss):
        return _chart(data.loss, "loss", "Training loss per rank", "step", "loss (cross-entropy)")
    log_ok = all(y > 0 for x in data.loss for _, y in x.points)
    smooth = tuple(smoothed(x) for x in data.loss)
    variants = [(f"v-{kind}-{scale}", plot_id, lines, scale == "log")
                for kind, lines, base in (("raw", data.loss, "loss"), ("smooth", smooth, "loss-smooth"))
                for scale, plot_id in (("linear", base), ("log", f"{base}-log")) if scale == "linear" or log_ok]
    figures = "".join(
        f'<div class="variant {cls}">'
        + _chart(lines, plot_id, "Training loss per rank" + (" (smoothed)" if "smooth" in cls else ""),
                 "step", "loss (cross-entropy)" + (", log scale" if log else ""), log_y=log)
        + "</div>" for cls, plot_id, lines, log in variants)
    log_box = ('<input type="checkbox" class="t-log" id="loss-log"><label class="toggles" for="loss-log">'
               "log scale</label>") if log_ok else \
        '<input type="checkbox" class="t-log" id="loss-log" disabled><label class="toggles">no log scale: a ' \
        "loss at or below zero</label>"
    return ('<div class="toggle-chart"><input type="checkbox" class="t-smooth" id="loss-smooth">'
            f'<label class="toggles" for="loss-smooth">smoothed (moving average, weight {LOSS_SMOOTHING:g}, as '
            f"TensorBoard)</label>{log_box}<div class=\"variants\">{figures}</div></div>")


def _step_time(data: ReportData) -> str:
    if not data.step_time:
        return _not_recorded("step_time")
    return (_chart(data.step_time, "step-time", "Step time per rank", "step", "step time (s)", y_from_zero=True)
            + "<p>The time of each logged step, measured by the StepTimer (device synchronised on accelerators).</p>")


def _work_time(data: ReportData) -> str:
    if not data.work_time:
        return _not_recorded("work_time")
    return (_chart(data.work_time, "work-time", "Work time per rank", "last step of window",
                   "work time per step (s)", y_from_zero=True)
            + "<p>Each rank's mean time per step spent on its own work (data, forward, backward, optimizer), "
            "without the time it waits for the other ranks in collectives. A straggler stands out here; in the "
            "step times above every rank shows the slowest one's pace, and in the collective time share below "
            "the slowest rank has the smallest share, because it is the one the others wait for.</p>")


def _phases(data: ReportData) -> str:
    if not data.phases:
        return _not_recorded("phases")
    rows = data.culprits[:WORST_WINDOWS]
    found = (f"<p>Windows in which the other ranks waited over 0.2 of their step (msprof's flag) for one rank "
             f"whose excess in one phase explains most of the wait: {len(data.culprits)}"
             + (f"; the first {len(rows)}:</p>" + _table(("steps", "the rank the others waited for",
                                                         "their wait"), rows) if rows else ".</p>"))
    return (_chart(data.phases, "phases", "Where each step goes", "last step of window", "seconds per step",
                   y_from_zero=True)
            + "<p>Each phase's seconds per step over the job's ranks: the median and the largest. A phase whose "
            "largest sits far above its median is one slow rank, and the others then show its extra time as "
            "comm_wait. comm_transfer is estimated as the least blocked rank's communication time (no clock says "
            "when each peer arrived).</p>" + found)


def _skew(data: ReportData) -> str:
    if not data.skew:
        return _not_recorded("skew")
    points = tuple((float(w.last_step), w.skew) for w in data.skew)
    series = (Series("skew (stddev / mean of rank step times)", points),)
    above = [w for w in data.skew if w.skew > data.skew_threshold]
    worst = sorted(data.skew, key=lambda w: (-w.skew, w.last_step))[:WORST_WINDOWS]
    rows = [(f"{w.first_step}-{w.last_step}", f"{w.skew:.4f}", str(w.straggler)) for w in worst]
    return (_chart(series, "skew", "Step-time skew across ranks", "last step of window", "skew (ratio)",
                   y_from_zero=True, threshold=data.skew_threshold)
            + f'<p data-above="{len(above)}">{len(above)} of {len(data.skew)} windows above the dashed line at '
            f"{data.skew_threshold:g}, the seed's skew rule kept for reference: no alert uses it (skew dilutes as "
            "1/sqrt(ranks); the straggler alert and diagnoses use each rank's slowdown). "
            f"The {len(worst)} worst:</p>"
            + _table(("steps", "skew", "slowest rank"), rows))


def _link(path: Path) -> str:
    return f'<a href="{escape(path.resolve().as_uri())}">{escape(path.name)}</a>'


def _files(files: Sequence[RunFile], missing: str, headers: Sequence[str], size: bool) -> str:
    if not files:
        return f'<p class="not-recorded">{escape(missing)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        f'<tr><td class="l">{_link(f.path)}</td><td>{f.step}</td>'
        + (f"<td>{escape(number_label(f.size_bytes))}B</td>" if size else "")
        + f"<td>{escape(utc_time(f.mtime))}</td></tr>" for f in files)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _diagnoses(data: ReportData) -> str:
    if not data.diagnoses:
        return ('<p class="not-recorded">None written. Diagnosis files are off unless the job runs with '
                "--straggler-diagnosis WINDOWS (examples/train_ddp.py), which writes one after WINDOWS flagged "
                "windows in a row; `npudist diagnose RUN_DIR` reads them back with hangs and checkpoints.</p>")
    head = "".join(f"<th>{h}</th>" for h in ("file", "where", "what", "next", "written"))
    rows = []
    for f in data.diagnoses:
        found = data.diagnosis_verdicts.get(f.path.name)
        where = verdicts.where(found.rank, found.place) if found else "unreadable (see Data problems)"
        what = found.summary if found else ""
        nxt = "; ".join(found.next_commands) if found else ""
        rows.append(f'<tr><td class="l">{_link(f.path)}</td><td class="l">{escape(where)}</td>'
                    f'<td class="l">{escape(what)}</td><td class="l"><code>{escape(nxt)}</code></td>'
                    f"<td>{escape(utc_time(f.mtime))}</td></tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _checkpoints(data: ReportData) -> str:
    return _files(data.checkpoints, "None in the run directory.", ("checkpoint", "step", "size", "saved"),
                  size=True)


ABORT_HEADINGS = MappingProxyType({"hang": "Aborted: the job hung",
                                   "nonfinite": "Aborted: a loss or gradient went NaN/Inf"})


def _aborted(data: ReportData) -> str:
    """The run's end, first on the page when npudist stopped it: what stopped it, where, and the verdict."""
    if not data.aborted:
        return ""
    first = data.aborted[0]
    rows = "".join(f"<li>{escape(verdicts.where(v.rank, v.place))}: {escape(v.summary)} "
                   f"<small>({escape(v.source)})</small></li>" for v in data.aborted[:8])
    more = f"<p>and {len(data.aborted) - 8} more</p>" if len(data.aborted) > 8 else ""
    heading = ABORT_HEADINGS.get(first.kind, "Aborted")
    return f'<div class="aborted" id="aborted"><strong>{escape(heading)}</strong><ul>{rows}</ul>{more}</div>'


def _card(data: ReportData) -> str:
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in data.card)
    return f'<dl class="card" id="card">{items}</dl>'


def _comm(data: ReportData) -> str:
    if not data.comm:
        return _not_recorded("comm")
    rows = [(f"rank {c.rank}", f"{c.wall_seconds:.3f}", f"{c.collective_seconds:.3f}",
             "n/a" if c.share is None else f"{c.share * 100:.1f} %") for c in data.comm]
    out = _table(("rank", "wall time (s)", "collective time (s)", "collective time share"), rows)
    ops = [(f"rank {c.rank}", op, backend, str(calls), str(nbytes), f"{seconds:.4f}")
           for c in data.comm for op, backend, calls, nbytes, seconds in c.ops]
    if ops:
        out += _table(("rank", "op", "backend", "calls", "bytes", "seconds"), ops, left=3)
    else:
        out += ("<p>No collective was recorded in this run. npudist.comm's collectives and DDP's gradient "
                "all-reduce under npudist.ddp(model) are counted; torch.distributed called directly "
                "is not.</p>")
    return out


def _bench(data: ReportData) -> str:
    if not data.bench:
        return _not_recorded("bench")
    return _chart(data.bench, "busbw", "Bus bandwidth vs message size", "message size (bytes)",
                  "bus bandwidth (GB/s)", log2_x=True, y_from_zero=True)


def _device(data: ReportData) -> str:
    if not data.device:
        return _not_recorded("device")
    parts = []
    for field_name, heading, y_label, _ in DEVICE_PLOTS:
        series = data.device.get(field_name)
        if series:
            bounds = {"y_from_zero": True, "y_max": 1.0} if field_name.endswith("_ratio") else {}
            parts.append(f"<h3>{escape(heading)}</h3>"
                         + _chart(series, field_name, heading, "seconds since the run's first record", y_label,
                                  **bounds))
        else:
            parts.append(f'<h3>{escape(heading)}</h3><p class="not-recorded" data-missing="{field_name}">'
                         f"Not recorded by this device source.</p>")
    return "".join(parts)


def _problems(data: ReportData) -> str:
    if not data.problems:
        return "<p>None: every line and file was read.</p>"
    rows = [(p.source, "" if p.line is None else str(p.line), p.reason) for p in data.problems[:200]]
    more = len(data.problems) - len(rows)
    return (f'<p class="problems" data-count="{len(data.problems)}">{len(data.problems)} unusable '
            f"line(s) or file(s) were skipped.</p>" + _table(("file", "line", "reason"), rows, left=3)
            + (f"<p>... and {more} more.</p>" if more > 0 else ""))


def render(data: ReportData, title: str) -> str:
    """The whole page; ``title`` (usually the run directory) is escaped like every other text."""
    sections = [
        _aborted(data),
        _card(data),
        _section("summary", "Run", _table(("", ""), data.summary, left=2)),
        _section("loss", "Loss", _loss(data)),
        _section("step-time", "Step time", _step_time(data)),
        _section("work-time", "Work time per rank", _work_time(data)),
        _section("phases", "Where each step goes", _phases(data)),
        _section("skew", "Skew and stragglers", _skew(data)),
        _section("diagnoses", "Straggler diagnoses", _diagnoses(data)),
        _section("checkpoints", "Checkpoints", _checkpoints(data)),
        _section("comm", "Collective time share", _comm(data)),
        _section("bench", "Bus bandwidth (npudist bench collective)", _bench(data)),
        _section("device", "Device", _device(data)),
        _section("problems", "Data problems", _problems(data)),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "img-src data:\">"
            f"<title>npudist report: {escape(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>npudist run report: {escape(title)}</h1>" + "\n".join(sections) + "</body></html>\n")
