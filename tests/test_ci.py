"""CI runs the compatibility legs at both ends of the torch range pyproject.toml declares (issue 33)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _declared_range() -> tuple[tuple[int, ...], tuple[int, ...]]:
    spec = re.search(r'"torch\s*(>=[^"]*)"', (ROOT / "pyproject.toml").read_text())
    assert spec, "pyproject.toml no longer declares torch as a range"
    low = re.search(r">=\s*([\d.]+)", spec.group(1))
    high = re.search(r"<\s*([\d.]+)", spec.group(1))
    assert low and high, f"torch needs both bounds in pyproject.toml, found {spec.group(0)}"
    return _release(low.group(1)), _release(high.group(1))


def _ci_versions() -> list[tuple[int, ...]]:
    m = re.search(r'COMPAT_TORCH=\$\{COMPAT_TORCH:-"([^"]+)"\}', (ROOT / ".ci/run").read_text())
    assert m, ".ci/run no longer names the torch versions of its compatibility legs (COMPAT_TORCH)"
    return [_release(v) for v in m.group(1).split()]


def test_the_compatibility_legs_run_the_oldest_and_the_newest_supported_torch():
    low, high = _declared_range()
    versions = _ci_versions()
    oldest, newest = min(versions), max(versions)
    assert oldest[:2] == low[:2], (oldest, low)
    # the newest supported line: the one just below the exclusive upper bound
    assert newest < high and (newest[0], newest[1] + 1) == high[:2], (newest, high)
