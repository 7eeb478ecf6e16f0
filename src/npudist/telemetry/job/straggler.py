"""Straggler verdicts in words and on disk: the cause class, the console lines, RUN_DIR/straggler-step*.json.

The StragglerDetector (detector.py) flags ranks from their window mean *work* times; this module says what
the flagged rank was doing with its extra time and which card it runs on, so the diagnosis lands next to
the checkpoints while the slow card is still slow.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

from npudist.diagnosis.place import Place, iso, next_commands
from npudist.diagnosis.place import where as place_text
from npudist.diagnosis.straggler.phases import WAIT_RATIO_FLAG, Culprit, culprit, window_phases
from npudist.diagnosis.straggler.skew import SkewReport
from npudist.runtime.report_file import write_report

log = logging.getLogger("npudist.telemetry")

CAUSES = ("compute", "communication", "data")
"""Cause classes, in the order ties are broken."""
CAUSE_TEXT = MappingProxyType({
    "compute": "its own compute is slower",
    "communication": "it waits longer in exposed communication",
    "data": "it waits for data before the forward",
})


def _at(values: tuple, rank: int) -> Any:
    return values[rank] if rank < len(values) else None


def sections(report: SkewReport, rank: int) -> dict[str, float | None]:
    """Mean seconds per step of ``rank`` in each section the step timer separates: data wait (before the
    forward), compute (the rest of its work) and exposed communication (DDP gradient-sync wait)."""
    data, comm = _at(report.data_waits, rank), _at(report.comm_waits, rank)
    work = report.means[rank]
    return {"data": data, "compute": None if not math.isfinite(work) else work - (data or 0.0),
            "communication": comm}


def cause(report: SkewReport, rank: int) -> tuple[str, dict[str, float]]:
    """The section in which ``rank`` spends the most time beyond the median of the other ranks, with every
    section's excess in seconds per step. Sections nobody measured count as 0."""
    others = [r for r in range(len(report.means)) if r != rank]
    excess: dict[str, float] = {}
    mine = sections(report, rank)
    for name in CAUSES:
        theirs = [v for r in others if (v := sections(report, r)[name]) is not None and math.isfinite(v)]
        own = mine[name]
        excess[name] = (own - statistics.median(theirs)) if own is not None and math.isfinite(own) and theirs \
            else 0.0
    best = max(CAUSES, key=lambda c: (excess[c], -CAUSES.index(c)))
    return best, excess


def _where(report: SkewReport, rank: int, place: Place | None = None) -> str:
    device = _at(report.devices, rank)
    parts = [f"{place.host} pid {place.pid}"] if place is not None and place.host else []
    parts += [] if device is None else [f"device {device[0]} chip {device[1]}"]
    return f" ({', '.join(parts)})" if parts else ""


def _placed(report: SkewReport, rank: int, place: Place | None) -> Place:
    """The rank's place with the physical card its skew row reported (the detector's exchange carries it)."""
    device = _at(report.devices, rank)
    place = place or Place()
    return place if device is None else Place(place.host, place.pid, place.local_rank, place.accelerator,
                                              device[0], device[1])


def _vitals(report: SkewReport, rank: int) -> str:
    temp, freq = _at(report.temperatures, rank), _at(report.frequencies, rank)
    return (f"device temperature {'n/a' if temp is None else f'{temp:.1f} C'}, "
            f"frequency {'n/a' if freq is None else f'{freq / 1e6:.0f} MHz'}")


def phase_culprit(report: SkewReport) -> Culprit | None:
    """The rank the others waited for over this window, from its phases (diagnosis/straggler/phases.py)."""
    return culprit(window_phases(report))


def describe_flag(report: SkewReport, rank: int, place: Place | None = None) -> str:
    """The console line when ``rank`` becomes a straggler: rank, host and pid (``place``, when known), card,
    slowdown, cause, vitals, the phase that explains it (when the rank is also the one the others waited
    for: ``phases: rank 1: data +41 ms per step``) and the next command to run."""
    ratio = _at(report.ratios, rank)
    kind, excess = cause(report, rank)
    nxt = next_commands("straggler", _placed(report, rank, place), kind)
    found = phase_culprit(report)
    phases = f"; phases: {found.text()}" if found is not None and found.rank == rank else ""
    return (f"straggler: rank {rank}{_where(report, rank, place)} works "
            f"{'n/a' if ratio is None else f'{ratio:.2f}x'} the median of the other ranks over steps "
            f"{report.first_step}-{report.last_step} ({report.means[rank]:.4f} s/step); cause: {kind} "
            f"({CAUSE_TEXT[kind]}, +{excess[kind]:.4f} s/step){phases}; its {_vitals(report, rank)}"
            + (f"; next: {nxt[0]}" if nxt else ""))


class PhaseWarnings:
    """One console line when the ranks start waiting for one rank whose phase explains it, and one when that
    ends: the culprit rule of phases.py, shown when the others' comm wait passes msprof's 0.2 of their step.
    Unlike the straggler detector it needs no history, so it speaks at the first window that shows it."""

    def __init__(self, flag: float = WAIT_RATIO_FLAG) -> None:
        self.flag = flag
        self.named: tuple[int, str] | None = None

    def __call__(self, report: SkewReport) -> list[str]:
        found = phase_culprit(report)
        named = (found.rank, found.cause) if found is not None and found.cause is not None and \
            found.others_wait_ratio > self.flag else None
        if named == self.named:
            return []
        lines = []
        if named is not None and found is not None:
            lines.append(f"phases: {found.text()} over steps {report.first_step}-{report.last_step}; the other "
                         f"ranks wait {found.others_wait_ratio:.0%} of their step for it in communication")
        elif self.named is not None:
            lines.append(f"phases: no rank keeps the others waiting over steps {report.first_step}-"
                         f"{report.last_step}")
        self.named = named
        for line in lines:
            log.warning("%s", line)
        return lines


def describe_recovery(report: SkewReport, rank: int) -> str:
    ratio = _at(report.ratios, rank)
    return (f"straggler: rank {rank}{_where(report, rank)} recovered over steps {report.first_step}-"
            f"{report.last_step} ({'n/a' if ratio is None else f'{ratio:.2f}x'} the median of the others)")


class StragglerWarnings:
    """One console line when a rank becomes a straggler and one when it recovers, not one per window."""

    def __init__(self, where: Callable[[list[int]], dict[int, Place]] | None = None) -> None:
        self.flagged: set[int] = set()
        self.where = where if where is not None else _hosts
        """Where ranks run (npudist.comm's records by default): asked once per newly flagged rank."""

    def __call__(self, report: SkewReport) -> list[str]:
        now = set(report.flagged)
        new = sorted(now - self.flagged)
        places = self.where(new) if new else {}
        lines = [describe_flag(report, r, places.get(r)) for r in new]
        lines += [describe_recovery(report, r) for r in sorted(self.flagged - now)]
        self.flagged = now
        for line in lines:
            log.warning("%s", line)
        return lines


def diagnosis(history: list[SkewReport], rank: int) -> dict[str, Any]:
    """The JSON document for a streak of windows (oldest first) in which ``rank`` was flagged; pure, for
    tests."""
    last = history[-1]
    kind, excess = cause(last, rank)
    finite = [m for m in last.means if math.isfinite(m)]
    return {
        "straggler_rank": rank,
        "flagged_ranks": list(last.flagged),
        "windows": len(history),
        "steps": [history[0].first_step, last.last_step],
        "slowdown_ratio": _at(last.ratios, rank),
        "slowdown_ratios": [_at(r.ratios, rank) for r in history],
        "cause": kind,
        "cause_text": CAUSE_TEXT[kind],
        "section_seconds": sections(last, rank),
        "phases": _phases_doc(last),
        "section_excess_seconds": excess,
        "straggler_step_seconds": [r.means[rank] for r in history],
        "median_step_seconds_all_ranks": statistics.median(finite) if finite else None,
        "skew": [r.skew for r in history],
        "device": {**_physical(_at(last.devices, rank)),
                   "temperature_celsius": _at(last.temperatures, rank),
                   "frequency_hertz": _at(last.frequencies, rank),
                   "utilization_ratio": _at(last.utilizations, rank)},
        "all_ranks_step_seconds": list(last.means),
        "time": time.time(),
    }


def _phases_doc(report: SkewReport) -> dict[str, Any]:
    """Each rank's mean phases per step over the window and the culprit (phases.py), for the JSON document."""
    found = phase_culprit(report)
    return {
        "per_rank_seconds": [None if p is None else dict(p.items()) for p in window_phases(report)],
        "culprit": None if found is None else {"rank": found.rank, "gap_seconds": found.gap_s,
                                               "cause": found.cause, "excess_seconds": dict(found.excess_s),
                                               "others_wait_ratio": found.others_wait_ratio,
                                               "text": found.text()},
    }


def _physical(device: tuple[int, int] | None) -> dict[str, int | None]:
    """The straggler's card as npu-smi names it (NPU ID, chip); None when its rank could not tell."""
    npu_id, chip_id = device if device is not None else (None, None)
    return {"npu_id": npu_id, "chip_id": chip_id}


def _hosts(ranks: list[int]) -> dict[int, Place]:
    from npudist.comm import where

    return where(ranks)


class StragglerDiagnosis:
    """Append to StepTimer.on_exchange on one rank: writes RUN_DIR/straggler-step<N>.json once per streak of
    ``windows`` consecutive windows in which the detector flags a rank (one document per flagged rank)."""

    def __init__(self, run_dir: str | os.PathLike, windows: int = 1,
                 where: Callable[[list[int]], dict[int, Place]] | None = None) -> None:
        if windows < 1:
            raise ValueError(f"windows must be >= 1, got {windows}")
        self.run_dir, self.windows = Path(run_dir), windows
        self.where = where if where is not None else _hosts
        """Where ranks run, so that a diagnosis says where to look (npudist.comm's records by default)."""
        self._streaks: dict[int, deque[SkewReport]] = {}
        self._written: set[int] = set()
        self.written: list[Path] = []

    def __call__(self, report: SkewReport) -> list[Path]:
        flagged = set(report.flagged)
        for rank in list(self._streaks):
            if rank not in flagged:
                del self._streaks[rank]
                self._written.discard(rank)
        out = []
        for rank in sorted(flagged):
            streak = self._streaks.setdefault(rank, deque(maxlen=self.windows))
            streak.append(report)
            if len(streak) < self.windows or rank in self._written:
                continue
            doc = diagnosis(list(streak), rank)
            place = _placed(report, rank, self.where([rank]).get(rank))
            doc.update(host=place.host, pid=place.pid, local_rank=place.local_rank, accelerator=place.accelerator,
                       where=place_text(rank, place), iso_time=iso(doc["time"]),
                       next_commands=list(next_commands("straggler", place, doc["cause"])))
            path = self._write(doc, report.last_step, rank, len(flagged))
            if path is not None:
                self._written.add(rank)
                out.append(path)
        return out

    def _write(self, doc: dict[str, Any], step: int, rank: int, count: int) -> Path | None:
        suffix = "" if count == 1 else f"-rank{rank}"
        path = self.run_dir / f"straggler-step{step:08d}{suffix}.json"
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_report(path, json.dumps(doc, indent=1))
        except OSError as exc:
            log.warning("could not write the straggler diagnosis to %s: %s", path, exc)
            return None
        self.written.append(path)
        log.warning("straggler diagnosis: rank %d flagged for %d window(s), cause %s; wrote %s", rank,
                    doc["windows"], doc["cause"], path)
        return path
