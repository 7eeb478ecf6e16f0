"""Reading a run directory: rank logs (format: npudist.telemetry.runlog_schema) and bench results (bench/*.json,
`npudist bench collective --out`). Parsing is pure; load_run() is the only I/O.

Bad data never stops the report: a line or file that cannot be used becomes a Problem shown on the page.
Every value the model sees has been checked here: numbers are finite float64, counts fit int64, text is
short, and nothing nests deeper than the format defines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npudist.telemetry import runlog_schema as schema

MAX_LINE = 1 << 20
"""Longest rank-log line read (bytes); the writer's longest (a comm record) is a few KiB."""
MAX_BENCH = 16 << 20
_META_KEYS = ("op", "dtype", "world", "backend")


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
    meta: dict[str, str]
    """op, dtype, world, backend as short strings (absent when the file had no usable value)."""
    rows: tuple[dict[str, float], ...]
    """size_bytes (> 0) and busbw_gbps, both finite."""
    written: float | None = None
    """When the result file was written (its modification time): a reading is dated, not timeless."""


@dataclass(frozen=True)
class RunFile:
    """A file or checkpoint directory of the run the report links to."""

    path: Path
    step: int
    size_bytes: int
    mtime: float


@dataclass
class RunRecords:
    records: list[dict[str, Any]] = field(default_factory=list)
    """Every usable rank-log record, checked by runlog_schema.check, in file order per rank."""
    bench: list[BenchResult] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    rank_files: int = 0
    diagnoses: list[RunFile] = field(default_factory=list)
    """RUN_DIR/straggler-step<N>.json, by step."""
    diagnosis_docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """File name -> the diagnosis document, for those that could be read (read_doc)."""
    checkpoints: list[RunFile] = field(default_factory=list)
    """RUN_DIR/step-<N>/ checkpoint directories (size: the files in them), by step."""
    abort_docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """File name -> a document saying the job was stopped: a hang verdict (hang-attempt*.json,
    hang-rank*.json) or a non-finite stop (nonfinite-step*.json)."""


_DIAGNOSIS = re.compile(r"^straggler-step(\d+)(?:-rank\d+)?\.json$")
MAX_DOC = 4 << 20
"""Largest diagnosis document read (bytes); a hang report over 8,192 ranks is a few MiB at most."""
_OPEN_DOC = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHECKPOINT = re.compile(r"^step-(\d+)$")
ABORT_DOCS = re.compile(r"^(hang-(attempt|rank)\d+|nonfinite-step\d+)\.json$")
"""What npudist writes when it stops a job: the hang reader's verdicts and the NaN sentinel's stop."""


def run_files(root: Path) -> tuple[list[RunFile], list[RunFile]]:
    """The straggler diagnoses and checkpoints under ``root`` (links only: their contents are not read)."""
    diagnoses, checkpoints = [], []
    for entry in sorted(root.iterdir()):
        for pattern, out in ((_DIAGNOSIS, diagnoses), (_CHECKPOINT, checkpoints)):
            m = pattern.match(entry.name)
            if m is None:
                continue
            try:
                st = entry.lstat()
                size = sum(f.lstat().st_size for f in entry.iterdir() if f.is_file()) if entry.is_dir() \
                    else st.st_size
            except OSError:
                continue
            out.append(RunFile(entry, int(m.group(1)), size, st.st_mtime))
    return sorted(diagnoses, key=lambda f: f.step), sorted(checkpoints, key=lambda f: f.step)


def read_doc(path: Path) -> dict[str, Any]:
    """A diagnosis JSON object from the run directory: a planted symlink or FIFO is refused, not followed or
    waited on, and a file past MAX_DOC is not read whole. OSError or ValueError say why not."""
    fd = os.open(path, _OPEN_DOC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = fh.read(MAX_DOC + 1)
    if len(data) > MAX_DOC:
        raise ValueError(f"larger than {MAX_DOC} bytes")
    doc = parse_json(data.decode("utf-8", errors="replace"))
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


class ReportError(ValueError):
    """The run directory cannot be reported on at all; the message says what to pass instead."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str) -> Any:
    """Standard JSON only (no NaN/Infinity); ValueError with a short reason for anything else."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def parse_rank_lines(lines: Iterable[str], source: str, rank: int) -> tuple[list[dict[str, Any]], list[Problem]]:
    """Records of one rank log; a line that is not a valid record of this version is a Problem.

    Lines written by a newer npudist are summed into one Problem that says to upgrade.
    """
    records: list[dict[str, Any]] = []
    problems: list[Problem] = []
    newer: list[tuple[int, int]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE:
            problems.append(Problem(source, number, f"line longer than {MAX_LINE} characters"))
            continue
        try:
            raw = parse_json(line)
        except ValueError as exc:
            # A run killed mid-write leaves half a line: count it, keep the rest.
            problems.append(Problem(source, number, f"not JSON (a truncated or hand-edited line?): {str(exc)[:80]}"))
            continue
        try:
            record = schema.check(raw)
        except schema.NewerVersion as exc:
            newer.append((number, exc.version))
            continue
        except schema.RecordError as exc:
            problems.append(Problem(source, number, str(exc)))
            continue
        record["rank"] = rank  # the file name is the authority: a copied line cannot move to another rank
        records.append(record)
    if newer:
        problems.append(Problem(source, newer[0][0], f"{len(newer)} line(s) skipped: "
                                + schema.newer_message(max(v for _, v in newer))))
    return records, problems


def _meta(meta: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key in _META_KEYS:
        value = meta.get(key)
        if isinstance(value, str) and len(value) <= 64:
            out[key] = value
        elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= schema.MAX_COUNT:
            out[key] = str(value)
    return out


def _bench_row(row: Any) -> dict[str, float] | None:
    if not isinstance(row, dict):
        return None
    try:
        size, busbw = schema.TYPES["number"][0](row.get("size_bytes")), schema.TYPES["number"][0](row.get("busbw_gbps"))
    except schema.RecordError:
        return None
    return {"size_bytes": size, "busbw_gbps": busbw} if size > 0 else None


def parse_bench(text: str, source: str) -> tuple[BenchResult | None, list[Problem]]:
    """One `npudist bench collective --json` document; rows without a usable size/busbw are Problems."""
    try:
        doc = parse_json(text)
    except ValueError:
        return None, [Problem(source, None, "not JSON; expected the output of npudist bench collective --json")]
    if not isinstance(doc, dict) or not isinstance(doc.get("meta"), dict) or not isinstance(doc.get("rows"), list):
        return None, [Problem(source, None, "expected an object with 'meta' and 'rows' (npudist bench collective "
                                            "--json)")]
    rows, problems = [], []
    for i, raw in enumerate(doc["rows"], 1):
        row = _bench_row(raw)
        if row is not None:
            rows.append(row)
        else:
            problems.append(Problem(source, None, f"row {i} has no positive finite size_bytes and busbw_gbps"))
    return BenchResult(source, _meta(doc["meta"]), tuple(rows)), problems


def _read_lines(path: Path) -> Iterable[str]:
    with path.open(encoding="utf-8", errors="replace") as fh:
        while line := fh.readline(MAX_LINE + 1):
            if not line.endswith("\n") and len(line) > MAX_LINE:  # skip the rest of an over-long line
                while (rest := fh.readline(MAX_LINE)) and not rest.endswith("\n"):
                    pass
            yield line.removesuffix("\n")


def load_run(run_dir: str | Path) -> RunRecords:
    """Read every rank log and bench result under ``run_dir``."""
    root = Path(run_dir)
    if not root.is_dir():
        raise ReportError(f"run directory {str(root)!r} does not exist or is not a directory; pass the --run-dir "
                          f"the job wrote (it holds {schema.METRICS_DIR}/rank0.jsonl)")
    out = RunRecords()
    metrics = root / schema.METRICS_DIR
    for path in sorted(metrics.glob("rank*.jsonl")) if metrics.is_dir() else []:
        rank = schema.rank_of(path.name)
        if rank is None:
            continue
        source = f"{schema.METRICS_DIR}/{path.name}"
        try:
            records, problems = parse_rank_lines(_read_lines(path), source, rank)
        except OSError as exc:
            out.problems.append(Problem(source, None, f"cannot read: {exc}"))
            continue
        out.rank_files += 1
        out.records += records
        out.problems += problems
    bench = root / "bench"
    for path in sorted(bench.glob("*.json")) if bench.is_dir() else []:
        source = f"bench/{path.name}"
        try:
            with path.open(encoding="utf-8", errors="replace") as fh:
                text = fh.read(MAX_BENCH + 1)
        except OSError as exc:
            out.problems.append(Problem(source, None, f"cannot read: {exc}"))
            continue
        if len(text) > MAX_BENCH:
            out.problems.append(Problem(source, None, f"larger than {MAX_BENCH} characters; not a bench result"))
            continue
        result, problems = parse_bench(text, source)
        out.problems += problems
        if result is not None:
            with contextlib.suppress(OSError):
                result = dataclasses.replace(result, written=path.stat().st_mtime)
            out.bench.append(result)
    out.diagnoses, out.checkpoints = run_files(root)
    for f in out.diagnoses:
        try:
            out.diagnosis_docs[f.path.name] = read_doc(f.path)
        except (OSError, ValueError) as exc:
            out.problems.append(Problem(f.path.name, None, f"unreadable diagnosis ({exc})"))
    for entry in sorted(root.iterdir()):
        if ABORT_DOCS.match(entry.name):
            try:
                out.abort_docs[entry.name] = read_doc(entry)
            except (OSError, ValueError) as exc:
                out.problems.append(Problem(entry.name, None, f"unreadable stop record ({exc})"))
    return out
