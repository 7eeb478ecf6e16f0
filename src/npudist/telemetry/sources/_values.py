"""Turning one printed vendor value into a base-unit number, or None when nothing usable was printed.

Every parser funnels its raw strings through these, so "not available" is spelled out once and unit
conversions happen exactly once, where data enters. An absurd number (hundreds of digits, past
Python's int-string limit, or one that becomes inf once converted) is "not available" too: these
functions return None for it and never raise, so one corrupt field cannot fail a scrape.
"""

from __future__ import annotations

import math
import re
from types import MappingProxyType

MIB = 1024 * 1024
"""npu-smi's "MB" are mebibytes (Ascend npu-smi command reference: memory in MB = 1024*1024 bytes)."""

# Spellings vendor tools use for "no value" (npu-smi NA, -, N/A; nvidia-smi [N/A]; blank).
_NA = frozenset({"", "na", "n/a", "[n/a]", "-", "--", "none", "null"})
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
MAX_INT_DIGITS = 19
"""Every count a vendor tool prints fits int64 (19 digits); a longer integer is corrupt output."""
_INTEGER = re.compile(rf"[+-]?\d{{1,{MAX_INT_DIGITS}}}")

HEALTH_STATES = ("OK", "Warning", "Alarm", "Critical", "UNKNOWN")
"""npu-smi health values (Ascend npu-smi reference, "info" command: Health column)."""
_HEALTH = MappingProxyType({h.lower(): h for h in HEALTH_STATES})


def is_na(raw: str | None) -> bool:
    return raw is None or raw.strip().lower() in _NA


def number(raw: str | None) -> float | None:
    """A plain decimal number; None for NA spellings, text, nan/inf or anything else."""
    if raw is None:
        return None
    text = raw.strip()
    if not _NUMBER.fullmatch(text):
        return None
    return finite(float(text))  # float() reads any digit count; hundreds of them come out inf


def finite(value: float | None) -> float | None:
    """``value`` when it is a finite number, else None (a conversion that overflowed is not a reading)."""
    return value if value is not None and math.isfinite(value) else None


def integer(raw: str | None) -> int | None:
    """A whole number (IDs, pids, byte counts); None when not printed as one."""
    if raw is None:
        return None
    text = raw.strip()
    return int(text) if _INTEGER.fullmatch(text) else None  # also keeps int() off its digit limit


def ratio_from_percent(raw: str | None) -> float | None:
    """0-100 % -> 0-1; values outside 0-100 are a driver bug, reported as missing rather than clamped."""
    value = number(raw.rstrip("%") if raw else raw)
    if value is None or not 0.0 <= value <= 100.0:
        return None
    return value / 100.0


def non_negative(raw: str | None) -> float | None:
    """Watts, hertz and other quantities that cannot be negative."""
    value = number(raw)
    return value if value is not None and value >= 0 else None


def celsius(raw: str | None) -> float | None:
    return number(raw)


def mib_to_bytes(raw: str | None) -> int | None:
    value = integer(raw)
    return value * MIB if value is not None and value >= 0 else None


def capacity_mib(raw: str | None) -> int | None:
    """A memory capacity in MiB; 0 means the chip has no such memory (910B prints DDR 0), so None."""
    value = mib_to_bytes(raw)
    return value if value else None


def mhz_to_hertz(raw: str | None) -> float | None:
    value = non_negative(raw)
    return finite(value * 1e6) if value is not None else None


def health(raw: str | None) -> str | None:
    """Canonical health spelling, or None for anything else (a retyped ``0K`` is not OK)."""
    if raw is None:
        return None
    return _HEALTH.get(raw.strip().lower())


def text(raw: str | None) -> str | None:
    return None if is_na(raw) else raw.strip()  # type: ignore[union-attr]


def frozen(table: dict) -> MappingProxyType:
    """A lookup table as a constant: the table and the dicts inside its tuples become read-only views."""
    def freeze(value):
        if isinstance(value, dict):
            return MappingProxyType(value)
        if isinstance(value, tuple):
            return tuple(freeze(x) for x in value)
        return value
    return MappingProxyType({k: freeze(x) for k, x in table.items()})
