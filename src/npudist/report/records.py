"""Reading a run directory: rank logs (metrics/rank{R}.jsonl, telemetry/runlog.py) and bench results
(bench/*.json, `npudist bench collective --out`). Parsing is pure; load_run() is the only I/O.

Bad data never stops the report: a line or file that cannot be used becomes a Problem shown on the page.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("start", "step", "skew", "device", "comm")
_RANK_FILE = re.compile(r"rank(\d+)\.jsonl")


@dataclass(frozen=True)
class Problem:
    source: str
    """File name relative to the run directory."""
    line: int | None
    """1-based line number, None for a whole file."""
    reason: str


@dataclass(frozen=True)
class BenchResult:
    source: str
    meta: dict[str, Any]
    rows: tuple[dict[str, Any], ...]
    """Rows with at least size_bytes and busbw_gbps, both finite numbers."""


@dataclass
class RunRecords:
    records: list[dict[str, Any]] = field(default_factory=list)
    """Every usable rank-log record, in file order per rank (each has kind, rank and time)."""
    bench: list[BenchResult] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    rank_files: int = 0


class ReportError(ValueError):
    """The run directory cannot be reported on at all; the message says what to pass instead."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_rank_lines(lines: Iterable[str], source: str, rank: int) -> tuple[list[dict[str, Any]], list[Problem]]:
    """Records of one rank log; a line that is not a JSON object of a known kind is a Problem."""
    records: list[dict[str, Any]] = []
    problems: list[Problem] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            # A run killed mid-write leaves half a line: count it, keep the rest.
            problems.append(Problem(source, number, "not JSON (a truncated or hand-edited line?)"))
            continue
        if not isinstance(record, dict) or record.get("kind") not in KINDS:
            problems.append(Problem(source, number, f"not a run-log record (kind must be one of {', '.join(KINDS)})"))
            continue
        if record["kind"] == "step" and not (isinstance(record.get("step"), int) and record["step"] >= 0):
            problems.append(Problem(source, number, "step record without a non-negative integer step"))
            continue
        if not _is_number(record.get("time")):
            problems.append(Problem(source, number, "record without a numeric time"))
            continue
        record["rank"] = rank  # the file name is the authority: a copied line cannot move to another rank
        records.append(record)
    return records, problems


def parse_bench(text: str, source: str) -> tuple[BenchResult | None, list[Problem]]:
    """One `npudist bench collective --json` document; rows without a usable size/busbw are Problems."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None, [Problem(source, None, "not JSON; expected the output of npudist bench collective --json")]
    if not isinstance(doc, dict) or not isinstance(doc.get("meta"), dict) or not isinstance(doc.get("rows"), list):
        return None, [Problem(source, None, "expected an object with 'meta' and 'rows' (npudist bench collective "
                                            "--json)")]
    rows, problems = [], []
    for i, row in enumerate(doc["rows"], 1):
        if isinstance(row, dict) and _is_number(row.get("size_bytes")) and row["size_bytes"] > 0 \
                and _is_number(row.get("busbw_gbps")):
            rows.append(row)
        else:
            problems.append(Problem(source, None, f"row {i} has no positive size_bytes and numeric busbw_gbps"))
    return BenchResult(source, doc["meta"], tuple(rows)), problems


def load_run(run_dir: str | Path) -> RunRecords:
    """Read every rank log and bench result under ``run_dir``."""
    root = Path(run_dir)
    if not root.is_dir():
        raise ReportError(f"run directory {str(root)!r} does not exist or is not a directory; pass the --run-dir "
                          f"the job wrote (it holds metrics/rank0.jsonl)")
    out = RunRecords()
    metrics = root / "metrics"
    files = sorted(metrics.glob("rank*.jsonl")) if metrics.is_dir() else []
    for path in files:
        m = _RANK_FILE.fullmatch(path.name)
        if m is None:
            continue
        source = f"metrics/{path.name}"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            out.problems.append(Problem(source, None, f"cannot read: {exc}"))
            continue
        out.rank_files += 1
        records, problems = parse_rank_lines(text.splitlines(), source, int(m.group(1)))
        out.records += records
        out.problems += problems
    bench = root / "bench"
    for path in sorted(bench.glob("*.json")) if bench.is_dir() else []:
        source = f"bench/{path.name}"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            out.problems.append(Problem(source, None, f"cannot read: {exc}"))
            continue
        result, problems = parse_bench(text, source)
        out.problems += problems
        if result is not None:
            out.bench.append(result)
    return out
