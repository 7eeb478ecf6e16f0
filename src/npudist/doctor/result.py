"""What a doctor check says: a status, one line of finding, and the fix."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
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


FINDING_CHARS = 160
"""A finding longer than this is cut in the table and the lines (``--json`` and ``--all`` keep it whole)."""


def shown(results: list[CheckResult], show_all: bool) -> tuple[list[CheckResult], list[CheckResult]]:
    """(rows to print, skips folded into one line): every row with ``show_all``, else the skips folded and
    long findings cut, so the checks that matter on this host stand out."""
    if show_all:
        return list(results), []
    rows = [r if len(r.finding) <= FINDING_CHARS else
            CheckResult(r.name, r.status, r.finding[:FINDING_CHARS - 30].rstrip() + " ... (--json: all of it)",
                        r.fix) for r in results if r.status != "skip"]
    return rows, [r for r in results if r.status == "skip"]


def skipped_line(skipped: list[CheckResult]) -> str | None:
    """``18 not applicable here: simulation, accelerator:npu, ... (--all says why)``, or None."""
    if not skipped:
        return None
    return f"{len(skipped)} not applicable here: {', '.join(r.name for r in skipped)} (--all says why)"


def compact(results: list[CheckResult], title: str, show_all: bool = False) -> list[str]:
    """Plain lines for a pipe or a log: status, check, finding; the fix on its own indented line, unbroken so it
    can be copied. Nothing wraps mid-token, whatever the width."""
    rows, skipped = shown(results, show_all)
    width = max((len(r.name) for r in rows), default=0)
    out = [title]
    for r in rows:
        out.append(f"{r.status:<4}  {r.name:<{width}}  {r.finding}")
        if r.fix:
            out.append(f"{'':<4}  {'':<{width}}  fix: {r.fix}")
    if (line := skipped_line(skipped)) is not None:
        out.append(f"skip  {line}")
    out.append(summary_line(results))
    return out


# Variables that decide where ranks run and how they talk: what a bug report or a colleague needs to see.
ENV_PREFIXES = ("NPUDIST_", "MASTER_", "HCCL_", "NCCL_", "TORCH_NCCL_", "TORCH_HCCL_", "ASCEND_", "GLOO_",
                "OMPI_COMM_WORLD_", "SLURM_")
ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "MLU_VISIBLE_DEVICES", "OMP_NUM_THREADS", "WORLD_SIZE", "RANK",
                       "LOCAL_RANK", "TORCH_DEVICE_BACKEND_AUTOLOAD"})


_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def environment_block(env: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines, shell-quoted, for the variables that shape a distributed job: pasted into
    a shell they recreate it exactly (values with spaces or quotes included)."""
    ours = [k for k in env if k in ENV_NAMES or k.startswith(ENV_PREFIXES)]
    # A name is printed bare after `export`, so only POSIX names are: any other (`NPUDIST_$(cmd)`, a
    # newline) would run or break out of a comment when pasted. They are counted, never echoed.
    names = sorted(k for k in ours if _SHELL_NAME.fullmatch(k))
    lines = ["# environment (paste into a shell to reproduce):"]
    lines += [f"export {k}={shlex.quote(env[k])}" for k in names] or ["# (none of the variables npudist reads is set)"]
    if len(ours) > len(names):
        lines.append(f"# {len(ours) - len(names)} variable(s) left out: their names are not shell names "
                     "([A-Za-z_][A-Za-z0-9_]*); `env` shows them")
    return lines
