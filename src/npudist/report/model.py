"""From run records to what the report shows: series per rank, skew windows, collective time share.

Pure: no files, no HTML. A resumed run repeats the steps after its last checkpoint; for a repeated step
the later record wins, since that is the one the final model descends from.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from npudist.diagnosis.straggler.phases import PHASES, WAIT_RATIO_FLAG, StepPhases, culprit
from npudist.report import verdicts
from npudist.report.records import Problem, RunFile, RunRecords
from npudist.report.times import duration_text, utc_time
from npudist.report.times import finite as _finite
from npudist.report.verdicts import Verdict
from npudist.telemetry.exposition.thresholds import SKEW_REFERENCE

SKEW_THRESHOLD = SKEW_REFERENCE
WORST_WINDOWS = 10
"""Skew windows listed in the table (the chart shows them all)."""


@dataclass(frozen=True)
class Series:
    name: str
    points: tuple[tuple[float, float], ...]
    """(x, y), sorted by x, finite values only."""
    breaks: tuple[float, ...] = ()
    """x values where a run segment (a resume) begins: the line is not drawn across the pause before them."""


@dataclass(frozen=True)
class SkewWindow:
    first_step: int
    last_step: int
    skew: float
    straggler: int
    means: tuple[float | None, ...] = ()
    """Each rank's mean work time per step over the window (seconds; the wait in collectives excluded)."""
    phases: tuple[StepPhases | None, ...] = ()
    """Each rank's mean seconds per step in each phase over the window (None: not recorded)."""


@dataclass(frozen=True)
class CommShare:
    rank: int
    wall_seconds: float
    collective_seconds: float
    share: float | None
    """collective_seconds / wall_seconds (0-1), None when no wall time was recorded."""
    ops: tuple[tuple[str, str, int, int, float], ...]
    """(op, backend, calls, bytes, seconds) summed over run segments."""


@dataclass(frozen=True)
class ReportData:
    summary: tuple[tuple[str, str], ...]
    loss: tuple[Series, ...]
    step_time: tuple[Series, ...]
    skew: tuple[SkewWindow, ...]
    comm: tuple[CommShare, ...]
    bench: tuple[Series, ...]
    device: dict[str, tuple[Series, ...]]
    """Device field -> one series per rank, x = seconds since the run's first record."""
    problems: tuple[Problem, ...]
    card: tuple[tuple[str, str], ...] = ()
    """The summary card at the top: how the run went, in label/value pairs."""
    diagnoses: tuple[RunFile, ...] = ()
    checkpoints: tuple[RunFile, ...] = ()
    skew_threshold: float = SKEW_THRESHOLD
    run_logs: int = 0
    """Rank log files read (0: the page can only say how to make them)."""
    diagnosis_verdicts: dict[str, Verdict] = field(default_factory=dict)
    """Straggler diagnosis file name -> what it says (rank, host, card, ratio, cause, next command)."""
    work_time: tuple[Series, ...] = ()
    """Per rank, mean work time per step per skew window (excludes the wait in collectives)."""
    aborted: tuple[Verdict, ...] = ()
    """Why npudist stopped the job (a hang, a non-finite loss), most severe first; empty: it was not stopped."""
    phases: tuple[Series, ...] = ()
    """Per phase, the median and the largest over ranks of its seconds per step, per skew window."""
    culprits: tuple[tuple[str, str, str], ...] = ()
    """(steps, the rank the others waited for and why, their wait ratio) for windows where one phase explains it."""


DEVICE_PLOTS = (
    # (record field, heading, y-axis label, scale applied for display)
    ("utilization_ratio", "Device utilization", "utilization (ratio 0-1)", 1.0),
    ("power_watts", "Device power", "power (W)", 1.0),
    ("temperature_celsius", "Device temperature", "temperature (°C)", 1.0),
    ("memory_used_bytes", "Device memory used", "memory used (GiB)", 1 / 2**30),
)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 and _finite(num / den) else None


def _by_rank(records: Iterable[dict[str, Any]], kind: str) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if r["kind"] == kind:
            out.setdefault(r["rank"], []).append(r)
    return dict(sorted(out.items()))


LOSS_SMOOTHING = 0.6
"""TensorBoard's default smoothing weight for its scalar charts."""


def smoothed(series: Series, weight: float = LOSS_SMOOTHING) -> Series:
    """An exponential moving average of the points, debiased at each start as TensorBoard's scalar smoothing
    is (so the first value is not pulled towards zero), and started afresh where a resumed segment begins."""
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    out, mean, n, prev_x = [], 0.0, 0, None
    for x, y in series.points:
        if prev_x is not None and any(prev_x < b <= x for b in series.breaks):
            mean, n = 0.0, 0
        mean, n = mean * weight + (1 - weight) * y, n + 1
        out.append((x, mean / (1 - weight ** n)))
        prev_x = x
    return Series(series.name, tuple(out), series.breaks)


def step_series(records: list[dict[str, Any]], field_name: str) -> tuple[Series, ...]:
    """One series per rank of ``field_name`` against step; the last record of a step wins."""
    out = []
    for rank, rows in _by_rank(records, "step").items():
        last: dict[int, float] = {}
        for r in rows:
            if _finite(r.get(field_name)):
                last[r["step"]] = float(r[field_name])
            else:
                last.pop(r["step"], None)
        if last:
            out.append(Series(f"rank {rank}", tuple(sorted((float(s), v) for s, v in last.items()))))
    return tuple(out)


def skew_windows(records: list[dict[str, Any]]) -> tuple[SkewWindow, ...]:
    """Every rank logs the same exchanged report: use the lowest rank that logged any."""
    ranks = _by_rank(records, "skew")
    if not ranks:
        return ()
    windows: dict[int, SkewWindow] = {}
    for r in next(iter(ranks.values())):
        first, last, skew, straggler = r.get("first_step"), r.get("last_step"), r.get("skew"), r.get("straggler")
        if isinstance(first, int) and isinstance(last, int) and _finite(skew) and isinstance(straggler, int):
            means = tuple(float(m) if _finite(m) else None for m in (r.get("means") or ()))
            windows[last] = SkewWindow(first, last, float(skew), straggler, means, _phases_of(r, len(means)))
    return tuple(windows[k] for k in sorted(windows))


def _phases_of(record: dict[str, Any], ranks: int) -> tuple[StepPhases | None, ...]:
    """The window's phases per rank from its ``phase_<name>`` lists; a rank missing any of them is None."""
    columns = [record.get(f"phase_{name}") for name in PHASES]
    if not all(isinstance(c, list) for c in columns):
        return ()
    out: list[StepPhases | None] = []
    for rank in range(ranks):
        values = [c[rank] if rank < len(c) else None for c in columns]
        out.append(StepPhases(**{n: float(v) for n, v in zip(PHASES, values, strict=True)})
                   if all(_finite(v) and v >= 0 for v in values) else None)
    return tuple(out)


def phase_series(windows: tuple[SkewWindow, ...]) -> tuple[Series, ...]:
    """Per phase, the median and the largest over ranks of its seconds per step, per window; phases that
    stayed at 0 everywhere are left out."""
    out = []
    for name in PHASES:
        for how, pick in (("median", statistics.median), ("largest", max)):
            points = tuple((float(w.last_step), float(pick(vals))) for w in windows
                           if (vals := [getattr(p, name) for p in w.phases if p is not None]))
            if any(y > 0 for _, y in points):
                out.append(Series(f"{name}, {how} over ranks", points))
    return tuple(out)


def culprit_rows(windows: tuple[SkewWindow, ...]) -> tuple[tuple[str, str, str], ...]:
    """The windows in which the others waited over msprof's 0.2 of their step for a rank one phase explains."""
    rows = []
    for w in windows:
        found = culprit(list(w.phases)) if w.phases else None
        if found is not None and found.cause is not None and found.others_wait_ratio > WAIT_RATIO_FLAG:
            rows.append((f"{w.first_step}-{w.last_step}", found.text(), f"{found.others_wait_ratio:.0%}"))
    return tuple(rows)


def work_series(windows: tuple[SkewWindow, ...]) -> tuple[Series, ...]:
    """Per rank, its mean work time per step (compute and data wait, not the wait for others) per window."""
    ranks = max((len(w.means) for w in windows), default=0)
    out = []
    for rank in range(min(ranks, 64)):  # a legend of 64 ranks is already past reading
        points = tuple((float(w.last_step), m) for w in windows if rank < len(w.means)
                       and (m := w.means[rank]) is not None)
        if points:
            out.append(Series(f"rank {rank}", points))
    return tuple(out)


def comm_shares(records: list[dict[str, Any]]) -> tuple[CommShare, ...]:
    """Collective seconds over wall seconds per rank, summed over every segment of a resumed run."""
    out = []
    for rank, rows in _by_rank(records, "comm").items():
        wall = sum(float(r["wall_seconds"]) for r in rows if _finite(r.get("wall_seconds")))
        ops: dict[tuple[str, str], list[Any]] = {}
        for r in rows:
            for op in r.get("ops") or ():
                acc = ops.setdefault((op["op"], op["backend"]), [0, 0, 0.0])
                acc[0] += op["calls"]
                acc[1] += op["bytes"]
                acc[2] += op["seconds"]
        collective = sum(acc[2] for acc in ops.values())
        if not (_finite(wall) and _finite(collective)):
            continue  # sums past float64: no meaningful share to show
        out.append(CommShare(rank, wall, collective, _ratio(collective, wall),
                             tuple((o, b, a[0], a[1], a[2]) for (o, b), a in sorted(ops.items()) if _finite(a[2]))))
    return tuple(out)


def bench_series(run: RunRecords) -> tuple[Series, ...]:
    """Bus bandwidth (GB/s, nccl-tests' busbw) against message size (bytes), one series per result file."""
    out = []
    for b in run.bench:
        m = b.meta
        dated = f", {utc_time(b.written)}" if b.written is not None else ""
        name = (f"{m.get('op', '?')} {m.get('dtype', '')} {m.get('world', '?')} ranks "
                f"{m.get('backend', '')} ({b.source}{dated})").replace("  ", " ")
        points = tuple(sorted((r["size_bytes"], r["busbw_gbps"]) for r in b.rows))
        if points:
            out.append(Series(name, points))
    return tuple(out)


def device_series(records: list[dict[str, Any]], t0: float) -> dict[str, tuple[Series, ...]]:
    out: dict[str, tuple[Series, ...]] = {}
    by_rank = _by_rank(records, "device")
    starts = {rank: tuple(sorted(r["time"] - t0 for r in rows if _finite(r["time"] - t0)))
              for rank, rows in _by_rank(records, "start").items()}
    for field_name, _, _, scale in DEVICE_PLOTS:
        series = []
        for rank, rows in by_rank.items():
            points = tuple(sorted(p for r in rows if _finite(r.get(field_name))
                                  and _finite((p := (r["time"] - t0, r[field_name] * scale))[0])))
            if points:
                series.append(Series(f"rank {rank}", points, starts.get(rank, ())))
        if series:
            out[field_name] = tuple(series)
    return out


def summary(run: RunRecords) -> tuple[tuple[str, str], ...]:
    starts = [r for r in run.records if r["kind"] == "start"]
    steps = [r["step"] for r in run.records if r["kind"] == "step"]
    ranks = sorted({r["rank"] for r in run.records})

    def values(key: str) -> str:
        found = sorted({str(r[key]) for r in starts if r.get(key) is not None})
        return ", ".join(found) if found else "not recorded"

    segments = Counter(r["rank"] for r in starts)
    devices = {r["rank"]: f"rank {r['rank']}: device {r['npu_id']} chip {r['chip_id']}" for r in starts
               if r.get("npu_id") is not None and r.get("chip_id") is not None}  # the latest segment's wins
    return (
        ("ranks with a log", f"{len(ranks)} ({run.rank_files} files)" if ranks else "none"),
        ("world size", values("world")),
        ("accelerator", values("accelerator")),
        ("backend", values("backend")),
        ("nodes", values("node")),
        ("physical devices (npu-smi NPU ID, chip)", "; ".join(devices[k] for k in sorted(devices)) or "not recorded"),
        ("last logged step", str(max(steps)) if steps else "not recorded"),
        ("run segments (starts incl. resumes)", str(max(segments.values())) if segments else "not recorded"),
        ("bench results", str(len(run.bench))),
    )


def card(run: RunRecords) -> tuple[tuple[str, str], ...]:
    """The first screen: when, how long, how far, how well, how fast, and what was run where."""
    if not run.records:
        return (("run logs", "none: run the job with --run-dir RUN_DIR so each rank writes metrics/rank{R}.jsonl"),)
    times = [r["time"] for r in run.records]
    starts = [r for r in run.records if r["kind"] == "start"]
    rank0 = [r for r in starts if r["rank"] == min(x["rank"] for x in starts)] if starts else []
    steps = step_series(run.records, "loss")
    losses = [y for _, y in steps[0].points] if steps else []
    rates = [float(r["samples_per_second"]) for r in run.records
             if r["kind"] == "step" and _finite(r.get("samples_per_second"))]

    def latest(key: str) -> str:
        found = [str(r[key]) for r in rank0 if r.get(key) is not None]
        return found[-1] if found else "not recorded"

    last_step = max((r["step"] for r in run.records if r["kind"] == "step"), default=None)
    hosts = sorted({str(r["node"]) for r in starts if r.get("node")})
    return (
        ("started", utc_time(min(times))),
        ("ended", utc_time(max(times))),
        ("duration", duration_text(run.records)),
        ("steps", "not recorded" if last_step is None else str(last_step)),
        ("final loss", f"{losses[-1]:.4f}" if losses else "not recorded"),
        ("best loss", f"{min(losses):.4f}" if losses else "not recorded"),
        ("mean samples/s", f"{sum(rates) / len(rates):.1f}" if rates else "not recorded"),
        ("command", latest("argv")),
        ("versions", f"npudist {latest('npudist_version')}, torch {latest('torch_version')}"),
        ("git commit", latest("git_commit")),
        ("hosts", ", ".join(hosts) or "not recorded"),
        ("world", latest("world")),
    )


def aborted(run: RunRecords) -> tuple[Verdict, ...]:
    """The verdicts of the stop records in the run directory; a verdict that rank 0's hang-attempt file and a
    failing rank's hang-rank file both carry (same kind, rank and time) is said once."""
    known = verdicts.places(run.records)
    found: dict[tuple[str, int | None, float | None], Verdict] = {}
    for name, doc in sorted(run.abort_docs.items()):
        read = verdicts.nonfinite_verdicts if name.startswith("nonfinite-") else verdicts.hang_verdicts
        for verdict in read(doc, name, known):
            found.setdefault((verdict.kind, verdict.rank, verdict.time), verdict)
    return tuple(verdicts.ordered(list(found.values())))


def build(run: RunRecords) -> ReportData:
    """Everything the page shows, computed from the records of one run directory."""
    times = [r["time"] for r in run.records]
    t0 = min(times) if times else 0.0
    return ReportData(
        summary=summary(run),
        loss=step_series(run.records, "loss"),
        step_time=step_series(run.records, "step_seconds"),
        skew=(windows := skew_windows(run.records)),
        work_time=work_series(windows),
        phases=phase_series(windows),
        culprits=culprit_rows(windows),
        comm=comm_shares(run.records),
        bench=bench_series(run),
        device=device_series(run.records, t0),
        problems=tuple(run.problems),
        card=card(run),
        run_logs=run.rank_files,
        diagnoses=tuple(run.diagnoses),
        diagnosis_verdicts={name: found for name, doc in run.diagnosis_docs.items()
                            if (found := verdicts.straggler_verdict(doc, name, verdicts.places(run.records)))},
        checkpoints=tuple(run.checkpoints),
        aborted=aborted(run),
    )
