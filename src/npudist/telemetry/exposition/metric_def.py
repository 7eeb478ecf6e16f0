"""A metric catalogue row and the Prometheus naming rules every row keeps: base units, the unit as the
name's suffix, ``_total`` on counters (https://prometheus.io/docs/practices/naming/). The rows themselves
are catalogue.py (and reliability_rows.py); this module holds what they are made of and checked against.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BASE_UNITS = ("seconds", "bytes", "watts", "celsius", "ratio", "hertz", "volts", "amperes", "bytes_per_second",
              "decibels")
# decibels: a signal-to-noise ratio as optical modules print it (a logarithmic ratio has no linear base).
TYPES = ("gauge", "counter", "histogram")

DEVICE_LABELS = ("node", "vendor", "device", "chip", "model")
# `job` is not exposed by the ranks: Prometheus sets it at scrape time (from the scrape config or the
# file_sd targets file `npudist launch` writes); an exposed `job` would be renamed to `exported_job`.
# `device` and `chip` name the physical device the rank computes on with the device metrics' values (npu-smi
# NPU ID and chip), so queries join a rank to its device on (node, device, chip); empty when unknown.
# `run` tells two runs of one job apart (run_label.py: NPUDIST_RUN_ID, Slurm job id, rendezvous id, run dir).
RANK_LABELS = ("rank", "local_rank", "node", "device", "chip", "run")
# A device's RoCE NIC: `nic` is hccn_tool's -i (the /etc/hccn.conf address_N index), `port` the port where the
# tool prints one (Ascend 950 tables), else empty.
LINK_LABELS = (*DEVICE_LABELS, "nic", "port")


def rank_label_values(values: Sequence[str]) -> list[str]:
    """``values`` as a list, refused unless there is one per RANK_LABELS: collectors append their own labels
    (op, backend) after these, so a short list would silently shift them onto the wrong names."""
    if len(values) != len(RANK_LABELS):
        raise ValueError(f"rank label values {list(values)} must be one per {RANK_LABELS}")
    return [str(v) for v in values]


@dataclass(frozen=True)
class MetricDef:
    name: str
    type: str
    """gauge, counter or histogram (info metrics are gauges ending in ``_info`` with the value 1)."""
    unit: str
    """One of BASE_UNITS, or "" for counts, states and identifiers."""
    help: str
    labels: tuple[str, ...]
    """Labels in the order collectors give their values."""
    source: str
    """Where the value comes from, for the docs/reference/telemetry.md table."""


# Suffixes that betray a non-base unit (milliseconds, percent, MiB, ...).
_BAD_SUFFIXES = ("_ms", "_milliseconds", "_us", "_percent", "_pct", "_mb", "_mib", "_kb", "_kib", "_gb",
                 "_mw", "_mhz", "_khz", "_millicelsius", "_count", "_sum", "_bucket")


def problems(rows: Iterable[MetricDef]) -> list[str]:
    """Every naming rule a row breaks, as readable lines (empty when the catalogue is sound)."""
    out: list[str] = []
    seen: set[str] = set()
    for m in rows:
        where = f"{m.name}:"
        if m.name in seen:
            out.append(f"{where} listed twice")
        seen.add(m.name)
        if not m.name.startswith("npudist_"):
            out.append(f"{where} missing the npudist_ prefix")
        if m.type not in TYPES:
            out.append(f"{where} type {m.type!r} is not one of {TYPES}")
        if m.unit and m.unit not in BASE_UNITS:
            out.append(f"{where} unit {m.unit!r} is not a base unit {BASE_UNITS}")
        stem = m.name.removesuffix("_total") if m.type == "counter" else m.name
        if m.type == "counter" and not m.name.endswith("_total"):
            out.append(f"{where} counters end in _total")
        if m.type != "counter" and m.name.endswith("_total"):
            out.append(f"{where} only counters end in _total")
        if m.unit and not stem.endswith("_" + m.unit):
            out.append(f"{where} name must end in its unit _{m.unit}")
        if not m.unit and any(stem.endswith("_" + u) for u in BASE_UNITS):
            out.append(f"{where} name ends in a unit but the row has none")
        if any(stem.endswith(s) for s in _BAD_SUFFIXES):
            out.append(f"{where} suffix names a non-base unit or a reserved series suffix")
        if m.name.endswith("_info") and m.type != "gauge":
            out.append(f"{where} info metrics are gauges")
        if len(set(m.labels)) != len(m.labels) or "le" in m.labels or "job" in m.labels:
            out.append(f"{where} labels repeat or use a reserved name (le, job)")
        if not m.help.strip():
            out.append(f"{where} has no help text")
    return out


def validate(rows: Iterable[MetricDef]) -> None:
    """Raise ValueError listing every broken naming rule."""
    found = problems(rows)
    if found:
        raise ValueError("metric catalogue is inconsistent:\n  " + "\n  ".join(found))
