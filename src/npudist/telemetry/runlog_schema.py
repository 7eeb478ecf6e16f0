"""The run-log format, defined once: the writer (telemetry/job/run_log.py) and the reader (report/records.py)
both use it.

It imports nothing from npudist, so the training side and `npudist report` share it without either layer
importing the other (report must not pull in torch or the exporters; telemetry must not depend on the report).

Layout: ``RUN_DIR/metrics/rank{R}.jsonl``, one JSON object per line, appended (a resumed run adds a new
``start`` record to the same file). Every record has ``v`` (VERSION), ``time`` (Unix seconds), ``rank`` and
``kind``; the other fields are listed per kind in KINDS, in Prometheus base units. A number the writer could
not measure (or that was not finite) is written as null, never as 0, NaN or Infinity.

Versioning: VERSION changes only when a reader of the previous version would misread a record (a field
renamed or removed, a unit or meaning changed). A new kind or a new optional field keeps it: readers skip
what they do not know. A reader refuses records of a newer version with a message saying to upgrade.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

VERSION = 1
METRICS_DIR = "metrics"
_RANK_FILE = re.compile(r"rank([0-9]{1,9})\.jsonl")

MAX_COUNT = 2**63 - 1
"""Counts (steps, ranks, calls, bytes) are int64 in torch and Prometheus; larger is not a real count."""
MAX_TEXT = 256
MAX_LIST = 1 << 16


def rank_file(run_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` of a run writes its log."""
    return Path(run_dir) / METRICS_DIR / f"rank{rank}.jsonl"


def rank_of(file_name: str) -> int | None:
    """The rank a log file belongs to (``rank12.jsonl`` -> 12), None for any other name."""
    m = _RANK_FILE.fullmatch(file_name)
    return int(m.group(1)) if m else None


class RecordError(ValueError):
    """A line is not a usable record of this version; the message names the field and what was wrong."""


class NewerVersion(RecordError):
    """The record was written by a newer npudist than this one."""

    def __init__(self, version: int) -> None:
        super().__init__(newer_message(version))
        self.version = version


def newer_message(version: int) -> str:
    return (f"run log version {version} is newer than this npudist reads ({VERSION}): upgrade npudist "
            f"(pip install -U npudist) to report it")


# Value checks: each returns the value as the reader should see it, or raises RecordError(reason).
def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"must be a non-negative integer, got {_kind_of(value)}")
    if not 0 <= value <= MAX_COUNT:
        raise RecordError("must be a non-negative integer below 2**63")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(f"must be a number, got {_kind_of(value)}")
    try:
        out = float(value)  # a JSON integer past float64's range raises here
    except OverflowError:
        raise RecordError("is a number too large for float64") from None
    if not math.isfinite(out):
        raise RecordError("must be a finite number (write null for a value not measured)")
    return out


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise RecordError(f"must be a string, got {_kind_of(value)}")
    if len(value) > MAX_TEXT:
        raise RecordError(f"is a string longer than {MAX_TEXT} characters")
    return value


MAX_NAMES = 64
"""Scalars a ``scalars`` record may carry (npudist.log names; the metrics keep fewer: progress.py)."""


def _named(value: Any) -> dict[str, float | None]:
    if not isinstance(value, dict) or len(value) > MAX_NAMES:
        raise RecordError(f"must be an object of at most {MAX_NAMES} names, each a number or null")
    out: dict[str, float | None] = {}
    for name, v in value.items():
        try:
            out[_text(name)] = None if v is None else _number(v)
        except RecordError as exc:
            raise RecordError(f"[{str(name)[:MAX_TEXT]!r}] {exc}") from None
    return out


def _numbers(value: Any) -> list[float | None]:
    if not isinstance(value, list) or len(value) > MAX_LIST:
        raise RecordError(f"must be a list of at most {MAX_LIST} numbers or nulls")
    return [None if v is None else _number(v) for v in value]


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    """A key of TYPES."""
    doc: str
    required: bool = False
    """Required fields may not be null or missing; the others may be null (not recorded)."""


def _op(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RecordError(f"must be an object, got {_kind_of(value)}")
    return _fields(value, OP_FIELDS)


def _ops(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > MAX_LIST:
        raise RecordError(f"must be a list of at most {MAX_LIST} objects")
    out = []
    for i, op in enumerate(value):
        try:
            out.append(_op(op))
        except RecordError as exc:
            raise RecordError(f"[{i}] {exc}") from None
    return out


TYPES: Mapping[str, tuple[Callable[[Any], Any], str]] = MappingProxyType({
    # type name -> (check, how the docs show it)
    "count": (_count, "integer >= 0"),
    "number": (_number, "number"),
    "text": (_text, "string"),
    "numbers": (_numbers, "list of numbers"),
    "named": (_named, "object of name: number"),
    "ops": (_ops, "list of {op, backend, calls, bytes, seconds}"),
})

COMMON: tuple[Field, ...] = (
    Field("v", "count", "format version (VERSION)", required=True),
    Field("time", "number", "Unix seconds when written", required=True),
    Field("rank", "count", "writer's rank (the reader trusts the file name instead)"),
)
OP_FIELDS: tuple[Field, ...] = (
    Field("op", "text", "collective name", required=True),
    Field("backend", "text", "torch.distributed backend", required=True),
    Field("calls", "count", "calls in this run segment", required=True),
    Field("bytes", "count", "payload bytes in this run segment", required=True),
    Field("seconds", "number", "seconds from issue to completion, summed", required=True),
)
DEVICE_FIELDS = ("utilization_ratio", "power_watts", "temperature_celsius", "memory_used_bytes", "frequency_hertz")
"""The device reading fields a ``device`` record carries, each a number or null."""


@dataclass(frozen=True)
class Kind:
    name: str
    when: str
    fields: tuple[Field, ...]


KINDS: Mapping[str, Kind] = MappingProxyType({k.name: k for k in (
    Kind("start", "run (or resume) starts", (
        Field("world", "count", "world size", required=True),
        Field("node", "text", "host name"),
        Field("run", "text", "the run label of the rank's metrics (NPUDIST_RUN_ID, Slurm job id, rendezvous id)"),
        Field("accelerator", "text", "accelerator row name (npu, cuda, cpu, ...)"),
        Field("backend", "text", "process group backend"),
        Field("start_step", "count", "step the segment resumes after (0: a fresh run)", required=True),
        Field("resume_source", "text", "where the resumed state came from: peer-memory, local-memory or disk"),
        Field("npu_id", "count", "physical card the rank computes on (npu-smi NPU ID), when known"),
        Field("chip_id", "count", "chip on that card, when known"),
        Field("argv", "text", "the command line of the script (sys.argv, shell-quoted)"),
        Field("npudist_version", "text", "npudist's version"),
        Field("torch_version", "text", "torch's version"),
        Field("git_commit", "text", "commit of the git checkout holding the script, when it is one"),
    )),
    Kind("step", "every logged step", (
        Field("step", "count", "step number", required=True),
        Field("loss", "number", "training loss"),
        Field("step_seconds", "number", "StepTimer's wall time of the step"),
        Field("samples_per_second", "number", "samples per second over the loop's logging window"),
    )),
    Kind("scalars", "a logged step, when the script recorded its own numbers (npudist.log)", (
        Field("step", "count", "step number", required=True),
        Field("values", "named", "the last value of each name the script logged (loss is in the step record)",
              required=True),
    )),
    Kind("skew", "every StepTimer exchange", (
        Field("first_step", "count", "first step of the window", required=True),
        Field("last_step", "count", "last step of the window", required=True),
        Field("skew", "number", "stddev/mean of the ranks' window means (ratio)"),
        Field("straggler", "count", "rank with the longest mean", required=True),
        Field("means", "numbers", "mean step seconds per rank"),
        Field("flagged", "numbers", "ranks the StragglerDetector flagged at this window"),
        Field("ratios", "numbers", "each rank's window mean over the median of the other ranks'"),
        *(Field(f"phase_{name}", "numbers", f"mean seconds per step in the {name} phase per rank "
                "(diagnosis/straggler/phases.py)")
          for name in ("data", "compute", "comm_wait", "comm_transfer", "other")),
    )),
    Kind("device", "a logged step, when the rank's device source has a new reading", (
        Field("vendor", "text", "vendor row name"),
        Field("device_id", "count", "vendor tool's device id (npu-smi NPU ID)"),
        *(Field(name, "number", "device reading") for name in DEVICE_FIELDS),
    )),
    Kind("comm", "RunLog.close()", (
        Field("wall_seconds", "number", "wall time of the run segment"),
        Field("ops", "ops", "npudist.comm.stats() made in the segment", required=True),
    )),
)})


def _kind_of(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _fields(record: dict[str, Any], fields: tuple[Field, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        value = record.get(f.name)
        if value is None:
            if f.required:
                raise RecordError(f"field {f.name!r} is missing (required)")
            out[f.name] = None
            continue
        try:
            out[f.name] = TYPES[f.type][0](value)
        except RecordError as exc:
            raise RecordError(f"field {f.name!r} {exc}") from None
    return out


def check(record: Any) -> dict[str, Any]:
    """The record as the reader should use it: only the fields defined here, each checked and normalised
    (numbers as finite floats, counts as int64-range ints, absent optional fields as None).

    Raises NewerVersion for a record of a later format, RecordError naming the first bad field otherwise.
    """
    if not isinstance(record, dict):
        raise RecordError(f"not a run-log record (a JSON object), got {_kind_of(record)}")
    version = record.get("v")
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise NewerVersion(version) if version <= MAX_COUNT else RecordError("field 'v' is not a version")
    kind = KINDS.get(record.get("kind")) if isinstance(record.get("kind"), str) else None
    if kind is None:
        raise RecordError(f"not a run-log record (kind must be one of {', '.join(KINDS)})")
    out = _fields(record, COMMON)
    if out["v"] < 1:
        raise RecordError("field 'v' must be a version >= 1")
    out["kind"] = kind.name
    out.update(_fields(record, kind.fields))
    return out


def markdown_table() -> str:
    """The docs' table of record kinds (docs/reference/report.md), generated so it cannot drift from the schema."""
    lines = ["| kind | written | fields (* required) |", "|---|---|---|"]
    for k in KINDS.values():
        fields = ", ".join(f"`{f.name}`{'*' if f.required else ''} ({TYPES[f.type][1]}: {f.doc})" for f in k.fields)
        lines.append(f"| `{k.name}` | {k.when} | {fields} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - `python -m npudist.telemetry.runlog_schema` prints the docs table
    print(markdown_table(), end="")
