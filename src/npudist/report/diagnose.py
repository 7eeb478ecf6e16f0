"""`npudist diagnose RUN_DIR`: a run directory's hang reports, straggler diagnoses, run log and checkpoint
directories read back into verdicts (verdicts.py), most severe first.

The run directory is untrusted like the report's input: a file that is a symlink, too large or not the
expected JSON is a problem line, never an exception; what can be read is still reported.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from npudist.checkpoint import layout
from npudist.report import verdicts as v
from npudist.report.records import Problem, ReportError, load_run, read_doc
from npudist.telemetry import runlog_schema as schema

_DOCS = (("hang", re.compile(r"^hang-(attempt\d+|rank\d+)\.json$")),
         ("nonfinite", re.compile(r"^nonfinite-step\d+\.json$")),
         ("straggler", re.compile(r"^straggler-step\d+(-rank\d+)?\.json$")))


@dataclass
class Diagnosis:
    verdicts: list[v.Verdict] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    straggler_files: int = 0
    """straggler-step*.json files found: none with a flagged rank in the run log means diagnosis files were off."""


def diagnose(run_dir: str | Path) -> Diagnosis:
    """Every verdict ``run_dir`` holds; ReportError when it is not a directory."""
    root = Path(run_dir)
    run = load_run(root)  # checks the directory; the run log's records are schema-checked there
    out = Diagnosis(problems=list(run.problems))
    known = v.places(run.records)
    for entry in sorted(root.iterdir()):
        kind = next((k for k, pattern in _DOCS if pattern.match(entry.name)), None)
        if kind is not None:
            out.straggler_files += kind == "straggler"
            if kind == "straggler":  # load_run read these (and listed the unreadable ones as problems)
                doc = run.diagnosis_docs.get(entry.name)
                found = v.straggler_verdict(doc, entry.name, known) if doc is not None else None
                out.verdicts += [found] if found is not None else []
                continue
            try:
                doc = read_doc(entry)
            except (OSError, ValueError) as exc:
                out.problems.append(Problem(entry.name, None, f"unreadable ({exc})"))
                continue
            read = v.nonfinite_verdicts if kind == "nonfinite" else v.hang_verdicts
            out.verdicts += read(doc, entry.name, known)
            continue
        leftover = layout.parse_leftover(entry.name)
        step = layout.parse_step(entry.name)
        if leftover is not None and entry.is_dir() and not entry.is_symlink():
            out.verdicts.append(v.checkpoint_verdict(leftover[1], leftover[0], entry.name, _mtime(entry)))
        elif step is not None and entry.is_dir() and not entry.is_symlink() \
                and not (entry / layout.MANIFEST).is_file():
            out.verdicts.append(v.checkpoint_verdict(step, "manifest", entry.name, _mtime(entry)))
    if not out.straggler_files:
        out.verdicts += v.logged_stragglers(run.records, known, f"{schema.METRICS_DIR}/rank*.jsonl")
    out.verdicts = v.ordered(_once(out.verdicts))
    return out


def _once(verdicts: list[v.Verdict]) -> list[v.Verdict]:
    """One verdict per rank and moment: rank 0's hang-attempt file and each failing rank's hang-rank file carry
    the same verdict (same time), which is said once, from the first file (hang-attempt sorts first)."""
    seen: set[tuple[str, int | None, float]] = set()
    out = []
    for verdict in verdicts:
        if verdict.kind != "hang" or verdict.time is None:
            out.append(verdict)
            continue
        key = (verdict.kind, verdict.rank, verdict.time)
        if key in seen:
            continue
        seen.add(key)
        out.append(verdict)
    return out


def _gone_here(place: v.Place, alive: Callable[[int], bool]) -> bool:
    """The rank ran on this host and its process no longer exists: commands for its pid would look at
    nothing (or at another process that got the number)."""
    return bool(place.pid) and place.host == socket.gethostname() and not alive(place.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _mtime(path: Path) -> float | None:
    try:
        return path.lstat().st_mtime
    except OSError:
        return None


def lines(diag: Diagnosis, run_dir: str, alive: Callable[[int], bool] = _alive) -> list[str]:
    """The console answer: the headline, then each verdict with where, when and what to run next (a verdict
    line shared by the culprits of one verdict is printed once, under the first)."""
    out = [f"npudist diagnose {run_dir}: {v.headline(diag.verdicts)}"]
    said = None
    for i, verdict in enumerate(diag.verdicts, 1):
        when = v.iso(verdict.time) or "time unknown"
        out.append(f"{i}. {verdict.kind} at {when}: {v.where(verdict.rank, verdict.place)} ({verdict.source})")
        if verdict.summary != said:
            out.append(f"   {verdict.summary}")
        else:
            out.append("   (the same verdict as above)")
        said = verdict.summary
        if verdict.next_commands and _gone_here(verdict.place, alive):
            out.append(f"   pid {verdict.place.pid} no longer runs on this host: the job has ended; its logs and "
                       "this run directory are what is left to read")
        else:
            out += [f"   next: {cmd}" for cmd in verdict.next_commands]
    if not diag.straggler_files and not any(x.kind == "straggler" for x in diag.verdicts):
        out.append("straggler diagnosis files: none (off unless the job runs with --straggler-diagnosis WINDOWS, "
                   "which writes RUN_DIR/straggler-step*.json with the cause)")
    out += [f"skipped {p.source}{'' if p.line is None else f':{p.line}'}: {p.reason}" for p in diag.problems[:20]]
    if len(diag.problems) > 20:
        out.append(f"... and {len(diag.problems) - 20} more unusable record(s)")
    # Hosts, file names and reasons came from the run directory too: no line may carry a control character.
    return [v.printable(line) for line in out]


__all__ = ["Diagnosis", "ReportError", "diagnose", "lines"]
