"""Parsers for the reliability outputs of ``npu-smi info``: ``-t ecc``, ``-t health`` and the per-core
split of ``-t usages``, as Measurements in base units (counts, 0-1 ratios).

Layout facts, from the recordings in ``tests/fakes/ascend-tools/`` (sources in ``tests/fakes/README.md``):
- ``-t ecc -i N`` prints one block per chip ending in ``Chip ID`` (910A/910B: DDR and HBM rows), one block
  with neither ID (Atlas 200I A2: ``Single-bit Error Count``, its only memory, DDR), or ``NPU ID`` and HBM
  rows without ``Chip ID`` (Ascend 950);
- ``-t health -i N -c C`` prints ``Health Status`` (chip form) or ``Health`` (950), space-separated hex
  ``Error Code``s, and an ``Error Information`` that continues on lines with an empty key;
- ``-t usages`` splits AI-core, vector (``Aivector``) and cube (``Aicube``, 950 and recent 910B drivers)
  utilization; 310B prints ``Memory Bandwidth Usage Rate(%)`` for its DDR.
The ``Health`` column of ``npu-smi info`` is the MCU's: a chip alarm shows only in ``-t health``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

from npudist.telemetry.sources import _values as v
from npudist.telemetry.sources.measurements import Measurement, m
from npudist.telemetry.sources.npu_smi.kv import normalise_key, parse_kv_blocks
from npudist.telemetry.sources.readings import ParseError

_ECC_FAMILIES: Mapping[str, tuple[str, Mapping[str, str]]] = v.frozen({
    # printed counter (after the memory prefix) -> (family, its labels). Single-bit errors are the ones ECC
    # corrects, double-bit ones it only detects: NVML's corrected/uncorrected split, so both vendors share
    # the families. "Aggregate Total" survives reboots; the plain count is since the driver loaded.
    "single bit error count": ("npudist_device_ecc_corrected_errors_total", {}),
    "double bit error count": ("npudist_device_ecc_uncorrected_errors_total", {}),
    "single-bit error count": ("npudist_device_ecc_corrected_errors_total", {}),
    "double-bit error count": ("npudist_device_ecc_uncorrected_errors_total", {}),
    "single bit aggregate total err cnt": ("npudist_device_ecc_aggregate_corrected_errors_total", {}),
    "double bit aggregate total err cnt": ("npudist_device_ecc_aggregate_uncorrected_errors_total", {}),
    "single bit isolated pages count": ("npudist_device_memory_retired_pages", {"cause": "single_bit"}),
    "double bit isolated pages count": ("npudist_device_memory_retired_pages", {"cause": "double_bit"}),
    "single bit next-isolated pages count": ("npudist_device_memory_pending_retirement_pages",
                                             {"cause": "single_bit"}),
    "double bit next-isolated pages count": ("npudist_device_memory_pending_retirement_pages",
                                             {"cause": "double_bit"}),
})
_MEMORY_PREFIXES = ("hbm", "ddr")
UNPREFIXED_MEMORY = "ddr"
"""Atlas 200I A2 (310B) prints ECC rows without a memory prefix: its only memory is DDR."""

ALARM_LEVELS: Mapping[str, int] = MappingProxyType({"OK": 0, "Warning": 1, "Alarm": 2, "Critical": 3})
"""npu-smi health -> alarm level: none, minor (Warning), major (Alarm), critical (npu-smi reference, "info -t
health": OK / Warning = general alarm / Alarm = major alarm / Critical = critical alarm)."""
MAX_ERROR_CODES = 16
"""Error codes exported per chip; a longer list is truncated so a corrupt output cannot grow series."""
_CODE = re.compile(r"[0-9A-Fa-f]{1,16}")

_USAGE_FAMILIES: Mapping[str, str] = MappingProxyType({
    "aivector usage rate(%)": "npudist_device_aivector_utilization_ratio",
    "aicube usage rate(%)": "npudist_device_aicube_utilization_ratio",
    "aicpu usage rate(%)": "npudist_device_aicpu_utilization_ratio",
    "ctrlcpu usage rate(%)": "npudist_device_ctrlcpu_utilization_ratio",
    "npu utilization(%)": "npudist_device_overall_utilization_ratio",
    "hbm bandwidth usage rate(%)": "npudist_device_hbm_bandwidth_utilization_ratio",
    "ddr bandwidth usage rate(%)": "npudist_device_ddr_bandwidth_utilization_ratio",
    "memory bandwidth usage rate(%)": "npudist_device_ddr_bandwidth_utilization_ratio",
})
# AI-core utilization stays npudist_device_utilization_ratio (read from the `info` table and -t usages).


def _chip_blocks(text: str, convert: Callable[[dict[str, str]], list[Measurement]]) -> list[Measurement]:
    """Measurements of every block, each tagged with the ``Chip ID`` printed anywhere in its block."""
    out: list[Measurement] = []
    for block in parse_kv_blocks(text):
        chip = v.integer(block["chip id"]) if "chip id" in block else None
        for x in convert(block):
            out.append(Measurement(x.metric, x.value, x.labels, chip))
    return out


def _ecc_block(block: dict[str, str]) -> list[Measurement]:
    out: list[Measurement] = []
    for key, raw in block.items():
        prefix, _, rest = key.partition(" ")
        memory, counter = (prefix, rest) if prefix in _MEMORY_PREFIXES else (UNPREFIXED_MEMORY, key)
        if counter not in _ECC_FAMILIES:
            continue
        family, labels = _ECC_FAMILIES[counter]
        count = v.integer(raw)
        out += m(family, count if count is not None and count >= 0 else None, memory=memory, **labels)
    return out


def parse_ecc(text: str) -> list[Measurement]:
    """``npu-smi info -t ecc -i N``: ECC counts and retired (isolated) pages per memory; ParseError when no
    ECC row is readable."""
    found = _chip_blocks(text, _ecc_block)
    if not found:
        raise ParseError("no `npu-smi info -t ecc` row (e.g. 'HBM Double Bit Error Count') with a count")
    return found


def parse_health(text: str) -> list[Measurement]:
    """``npu-smi info -t health -i N -c C``: alarm level (0-3), the number of error codes and one
    ``error_code_info`` per code; ParseError without a known health value."""
    health: str | None = None
    codes: list[str] = []
    for line in text.splitlines():
        key, sep, raw = line.partition(":")
        key = normalise_key(key)
        if not sep:
            continue
        if key in ("health status", "health"):
            health = v.health(raw)
        elif key == "error code" and not v.is_na(raw):
            codes = [c.upper() for c in raw.split()]
    if health is None or health not in ALARM_LEVELS:
        raise ParseError("no `Health Status`/`Health` line with OK, Warning, Alarm or Critical")
    if not all(_CODE.fullmatch(c) for c in codes):
        raise ParseError(f"error codes are not hexadecimal: {' '.join(codes)[:80]!r}")
    out = m("npudist_device_alarm_level", ALARM_LEVELS[health])
    out += m("npudist_device_error_codes", len(codes))
    for code in list(dict.fromkeys(codes))[:MAX_ERROR_CODES]:
        out += m("npudist_device_error_code_info", 1, code=code)
    return out


def _usage_block(block: dict[str, str]) -> list[Measurement]:
    out: list[Measurement] = []
    for key, family in _USAGE_FAMILIES.items():
        if key in block:
            out += m(family, v.ratio_from_percent(block[key]))
    return out


def parse_usages(text: str) -> list[Measurement]:
    """``npu-smi info -t usages -i N``: vector/cube/AI-CPU/control-CPU utilization and memory bandwidth use,
    0-1; ParseError when none of them is printed."""
    found = _chip_blocks(text, _usage_block)
    if not found:
        raise ParseError("no `npu-smi info -t usages` rate (e.g. 'Aivector Usage Rate(%)', "
                         "'HBM Bandwidth Usage Rate(%)') with a value")
    return found
