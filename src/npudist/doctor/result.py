"""What a doctor check says: a status, one line of finding, and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    finding: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def summary_line(results: list[CheckResult]) -> str:
    """``9 ok, 1 warn, 0 fail, 6 skip``: the verdict in one line."""
    return ", ".join(f"{sum(r.status == s for r in results)} {s}" for s in STATUSES)


def compact(results: list[CheckResult], title: str) -> list[str]:
    """Plain lines for a pipe or a log: status, check, finding; the fix on its own indented line, unbroken so it
    can be copied. Nothing wraps mid-token, whatever the width."""
    width = max((len(r.name) for r in results), default=0)
    out = [title]
    for r in results:
        out.append(f"{r.status:<4}  {r.name:<{width}}  {r.finding}")
        if r.fix:
            out.append(f"{'':<4}  {'':<{width}}  fix: {r.fix}")
    out.append(summary_line(results))
    return out
