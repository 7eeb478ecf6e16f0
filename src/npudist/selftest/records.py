"""What the ranks of `npudist test` wrote, turned into one verdict per check.

Each rank appends JSON lines to its own file (``rank<N>.jsonl``): a "start" line before a check and an
"end" line after it. Files rather than a collective carry the results, so a broken or hung collective
cannot hide its own verdict: a check some rank started and never ended is named as the one that hung.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CHECKS = ("process_group", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_reduce_many",
          "ddp_step", "checkpoint")
"""The checks in the order each rank runs them."""

PASS, FAIL, SKIP, NOT_RUN = "pass", "FAIL", "skip", "not run"
OK_STATUSES = frozenset({PASS, SKIP})
"""A skipped check says why (a checkpoint directory other nodes cannot read) and fails nothing."""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    check: str
    status: str
    """pass, FAIL, skip or "not run" (an earlier failure stopped the ranks before it)."""
    detail: str
    seconds: float = 0.0
    """The slowest rank's time for this check."""

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES


def read_records(directory: Path) -> dict[int, list[dict]]:
    """Every rank file's records by rank; a line still being written (not yet JSON) is left for later."""
    out: dict[int, list[dict]] = {}
    for path in sorted(directory.glob("rank*.jsonl")):
        stem = path.stem.removeprefix("rank")
        if not stem.isdigit():
            continue
        rows = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("check"), str):
                rows.append(row)
        out[int(stem)] = rows
    return out


def _ranks(ranks: Iterable[int]) -> str:
    got = sorted(ranks)
    return f"rank{'s' if len(got) > 1 else ''} {', '.join(map(str, got))}"


def _verdict(check: str, records: Mapping[int, Sequence[dict]], expected: int, finished: bool) -> Verdict | None:
    """``check``'s verdict, or None while it can still change (ranks still running)."""
    started = {r for r, rows in records.items() if any(x["check"] == check and x.get("event") == "start"
                                                          for x in rows)}
    ends = {r: x for r, rows in records.items() for x in rows if x["check"] == check and x.get("event") == "end"}
    seconds = max((float(x.get("seconds") or 0.0) for x in ends.values()), default=0.0)
    failed = {r: x for r, x in ends.items() if x.get("status") != PASS and x.get("status") != SKIP}
    if failed:
        first = failed[min(failed)]
        return Verdict(check=check, status=FAIL, detail=f"{_ranks(failed)}: {first.get('detail', '')}",
                       seconds=seconds)
    if len(ends) >= expected:
        skipped = {r: x for r, x in ends.items() if x.get("status") == SKIP}
        if skipped:
            return Verdict(check=check, status=SKIP, detail=f"{_ranks(skipped)}: {skipped[min(skipped)]['detail']}",
                           seconds=seconds)
        return Verdict(check=check, status=PASS, detail=ends[min(ends)].get("detail", ""), seconds=seconds)
    if not finished:
        return None
    hung = started - set(ends)
    if hung:
        return Verdict(check=check, status=FAIL, seconds=seconds,
                       detail=f"{_ranks(hung)} started it and never finished (hung or died; the launch output "
                              "below says which)")
    if check == CHECKS[0]:
        return Verdict(check=check, status=FAIL, detail=f"{expected - len(records)} of {expected} ranks never "
                       "started (the launch output below says why)")
    return Verdict(check=check, status=NOT_RUN, detail="an earlier failure stopped the ranks before it")


def verdicts(records: Mapping[int, Sequence[dict]], *, expected: int, finished: bool) -> list[Verdict]:
    """The verdicts known so far, in check order: each final once every one of the ``expected`` ranks of
    this node ended it, or once the job is over (``finished``); the list stops at the first undecided one."""
    out = []
    for check in CHECKS:
        found = _verdict(check, records, expected, finished)
        if found is None:
            break
        out.append(found)
    return out
