"""What went wrong in a run, from its diagnosis documents and run log: pure functions, for `npudist diagnose`.

Verdicts come in the order a user should read them: a hang stops the job, a straggler slows it, a failed
checkpoint save loses work. Each names where (rank, host, pid, card) and the next command to run there,
per accelerator, in the vendor's own tool (npu-smi, nvidia-smi, cnmon), the way `fr_trace` reads
flight-recorder dumps back into one answer.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from npudist.diagnosis.place import Place, from_doc, iso, next_commands, where

KINDS = ("hang", "nonfinite", "straggler", "checkpoint")
"""Verdict kinds, most severe first."""
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp"})
"""Unicode categories that do not print as themselves: controls (ESC starts a terminal escape, a new line
starts a line of its own), format characters (a bidi override reorders what follows) and line separators."""


def printable(text: str) -> str:
    """``text`` with every control or format character shown as an escape (``\\x1b``, ``\\n``, ``\\u202e``):
    text a run directory supplied cannot drive the terminal or start a line that looks like ours (a forged
    ``next:`` command). Idempotent: the escapes are plain characters."""
    if all(ch == " " or unicodedata.category(ch) not in _HIDDEN for ch in text):
        return text
    return "".join(ch if ch == " " or unicodedata.category(ch) not in _HIDDEN else
                   ascii(ch)[1:-1] for ch in text)


def from_file(text: str, source: str) -> str:
    """Text a file held, marked as such and quoted, its control characters escaped: it is the file's claim,
    not npudist's finding (the run directory is untrusted, like any input)."""
    return f'text read from {source}: "{printable(text)}"'


@dataclass(frozen=True)
class Verdict:
    kind: str
    summary: str
    rank: int | None = None
    place: Place = field(default_factory=Place)
    time: float | None = None
    next_commands: tuple[str, ...] = ()
    source: str = ""

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "iso_time": iso(self.time)}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _num(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _text(value: Any, limit: int = 400) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def places(records: list[dict[str, Any]]) -> dict[int, Place]:
    """Each rank's place from its latest start record (run log, checked by runlog_schema)."""
    out: dict[int, Place] = {}
    for rec in records:
        if rec.get("kind") == "start":
            out[rec["rank"]] = Place(host=rec.get("node"), accelerator=rec.get("accelerator"),
                                     card=rec.get("npu_id"), chip=rec.get("chip_id"))
    return out


def hang_verdicts(doc: Mapping[str, Any], source: str, known: Mapping[int, Place]) -> list[Verdict]:
    """A hang-attempt*.json (rank 0's verdict) or hang-rank*.json (a failing rank's report) document."""
    inner = doc.get("verdict") if isinstance(doc.get("verdict"), dict) else doc
    said = _text(inner.get("line")) or _text(doc.get("cause"))
    line = from_file(said, source) if said else "a collective stopped making progress"
    culprits = [r for r in inner.get("culprits", []) if _int(r) is not None] if isinstance(inner.get("culprits"),
                                                                                           list) else []
    if not culprits and isinstance(doc.get("not_reached"), list):
        culprits = [r for r in doc["not_reached"] if _int(r) is not None]
    details = inner.get("culprit_ranks") if isinstance(inner.get("culprit_ranks"), dict) else {}
    who = doc.get("where") if isinstance(doc.get("where"), dict) else {}
    at = _num(inner.get("time")) or _num(doc.get("time"))
    out = []
    for rank in culprits[:8] or [None]:
        extra = details.get(str(rank)) or who.get(str(rank)) or {}
        place = from_doc(extra if isinstance(extra, dict) else {}, known.get(rank) if rank is not None else None)
        state = extra.get("state") if isinstance(extra, dict) and isinstance(extra.get("state"), str) else None
        out.append(Verdict("hang", line, rank, place, at, next_commands("hang", place, state=state), source))
    return out


def nonfinite_verdicts(doc: Mapping[str, Any], source: str, known: Mapping[int, Place]) -> list[Verdict]:
    """A nonfinite-step*.json document (npudist/training/sentinel.py: every rank stopped on a NaN/Inf loss or gradient):
    one verdict per named rank, or one without a rank when only a reduced gradient was non-finite."""
    said = _text(doc.get("line"))
    step = _int(doc.get("step"))
    line = from_file(said, source) if said else f"a loss or gradient went non-finite at step {step}"
    at = _num(doc.get("time"))
    culprits = [c for c in doc.get("culprits", []) if isinstance(c, dict) and _int(c.get("rank")) is not None] \
        if isinstance(doc.get("culprits"), list) else []
    out = []
    for c in culprits[:8] or [None]:
        rank = c["rank"] if c is not None else None
        place = from_doc({"host": c.get("host")} if c is not None else {}, known.get(rank) if rank is not None
                         else None)
        out.append(Verdict("nonfinite", line, rank, place, at, (), source))
    return out


def straggler_verdict(doc: Mapping[str, Any], source: str, known: Mapping[int, Place]) -> Verdict | None:
    """A straggler-step*.json document (telemetry/job/straggler.py's diagnosis)."""
    rank = _int(doc.get("straggler_rank"))
    if rank is None:
        return None
    place = from_doc(doc, known.get(rank))
    ratio, cause = _num(doc.get("slowdown_ratio")), _text(doc.get("cause"), 32)
    shown = printable(cause) if cause else "unknown"
    told = _text(doc.get("cause_text"), 120)
    steps = doc.get("steps") if isinstance(doc.get("steps"), list) else []
    span = f" over steps {steps[0]}-{steps[-1]}" if len(steps) == 2 and all(_int(s) is not None for s in steps) else ""
    summary = (f"rank {rank} works {'n/a' if ratio is None else f'{ratio:.2f}x'} the median of the others{span}; "
               f"cause: {shown}" + (f" ({from_file(told, source)})" if told else ""))
    return Verdict("straggler", summary, rank, place, _num(doc.get("time")), next_commands("straggler", place, cause),
                   source)


def logged_stragglers(records: list[dict[str, Any]], known: Mapping[int, Place], source: str) -> list[Verdict]:
    """Ranks the detector flagged in the run log's skew records: the evidence when diagnosis files were off."""
    seen: dict[int, dict[str, Any]] = {}
    for rec in records:
        if rec.get("kind") == "skew":
            for r in rec.get("flagged") or []:
                if r is not None and float(r).is_integer() and 0 <= r < (1 << 31):  # finite: runlog_schema
                    seen.setdefault(int(r), rec)
    out = []
    for rank, rec in sorted(seen.items()):
        ratios = rec.get("ratios") or []
        ratio = ratios[rank] if rank < len(ratios) and ratios[rank] is not None else None
        place = known.get(rank, Place())
        summary = (f"rank {rank} flagged by the straggler detector over steps {rec['first_step']}-{rec['last_step']}"
                   + (f", {ratio:.2f}x the median of the others" if ratio is not None else "")
                   + " (from the run log; the cause needs --straggler-diagnosis)")
        out.append(Verdict("straggler", summary, rank, place, rec.get("time"), next_commands("straggler", place),
                           source))
    return out


def checkpoint_verdict(step: int, kind: str, source: str, at: float | None) -> Verdict:
    """A save that died (a leftover .tmp-/.old- directory) or a step directory without its manifest."""
    text = {"tmp": f"the checkpoint save of step {step} did not finish (its partial write is still in {source})",
            "old": f"replacing the checkpoint of step {step} did not finish ({source} holds the old copy)",
            "manifest": f"checkpoint step {step} has no manifest.json: it is not a complete checkpoint"}[kind]
    return Verdict("checkpoint", text, 0, Place(), at,
                   ("npudist's next save in this run directory cleans it up; check free space and quota: df -h "
                    "RUN_DIR",), source)


def ordered(verdicts: list[Verdict]) -> list[Verdict]:
    """Most severe kind first, then by time (undated last), then rank."""
    return sorted(verdicts, key=lambda v: (KINDS.index(v.kind), v.time is None, v.time or 0.0,
                                           -1 if v.rank is None else v.rank))


def headline(verdicts: list[Verdict]) -> str:
    if not verdicts:
        return "no hang, straggler or failed checkpoint recorded"
    first = verdicts[0]
    return f"{first.kind}: {where(first.rank, first.place)}: {first.summary}"
