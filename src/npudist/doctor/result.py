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
