"""`npudist doctor`: environment checks that explain what will break before a job starts."""

from __future__ import annotations

import importlib

from npudist.doctor.checks import CHECKS
from npudist.doctor.host import Host
from npudist.doctor.result import FAIL, OK, SKIP, STATUSES, WARN, CheckResult
from npudist.runtime.settings import SettingsError

AREAS = ("host_limits", "network", "multinode", "ascend", "ascend_host", "ascend_network", "processes")
"""Modules that register their area's checks on import, after checks.py's own; this is the report's order."""
for _area in AREAS:
    importlib.import_module(f"npudist.doctor.{_area}")


def run_checks(host: Host | None = None) -> list[CheckResult]:
    """Every registered check, in order; a check that raises becomes a failed result, not a crash."""
    host = host or Host()
    results: list[CheckResult] = []
    for name, fn in CHECKS:
        try:
            got = fn(host)
        except SettingsError as exc:  # the process's own settings: the `settings` check names the fix
            got = CheckResult(name, SKIP, f"not checked: {exc}", "see the settings check")
        except Exception as exc:
            got = CheckResult(name, FAIL, f"check crashed: {type(exc).__name__}: {exc}",
                              "report this as an npudist bug")
        results.extend(got if isinstance(got, list) else [got])
    return results


def exit_code(results: list[CheckResult]) -> int:
    return 1 if any(r.status == FAIL for r in results) else 0


def as_document(results: list[CheckResult]) -> dict:
    from npudist._version import __version__

    return {
        "npudist": __version__,
        "checks": [r.as_dict() for r in results],
        "summary": {s: sum(r.status == s for r in results) for s in STATUSES},
        "exit_code": exit_code(results),
    }


__all__ = ["FAIL", "OK", "SKIP", "WARN", "CheckResult", "Host", "as_document", "exit_code", "run_checks"]
