"""Device metrics from pollers' last good snapshots: one row of the table per DeviceReading field."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from prometheus_client.core import Metric

from npudist.telemetry.exposition.catalogue import family
from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.node_label import node_name
from npudist.telemetry.sources.poller import Poller, finite
from npudist.telemetry.sources.readings import DeviceReading

# metric -> DeviceReading attribute; readings are already in base units (readings.py), so no conversion.
FIELDS: tuple[tuple[str, str], ...] = (
    ("npudist_device_utilization_ratio", "utilization_ratio"),
    ("npudist_device_memory_used_bytes", "memory_used_bytes"),
    ("npudist_device_memory_total_bytes", "memory_total_bytes"),
    ("npudist_device_power_watts", "power_watts"),
    ("npudist_device_temperature_celsius", "temperature_celsius"),
    ("npudist_device_frequency_hertz", "frequency_hertz"),
)


def _text(value: object) -> str:
    return "" if value is None else str(value)


def device_labels(node: str, r: DeviceReading) -> list[str]:
    return [node, r.vendor, str(r.device_id), str(r.chip_id), _text(r.name)]


def exportable(value: object) -> float | None:
    """The sample value of a reading field: None for "not available" and for anything that is not a
    finite float (NaN, inf, an int too large for a float), which no parse may turn into +Inf/NaN."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return x if math.isfinite(x) else None


_INFO_OPTIONAL = frozenset({"health", "bus_id", "logical_id"})
"""Info labels a source may not report (NVML has no health verdict): left off rather than set to "", so a
series never claims an empty health."""


def _add_info(info: Metric, values: list[str]) -> None:
    labels = {name: value for name, value in zip(info._labelnames, values, strict=True)
              if value or name not in _INFO_OPTIONAL}
    info.add_sample(info.name, labels, 1.0)


def models(pollers: Sequence[Poller]) -> dict[tuple[str, int, int], str]:
    """(vendor, device, chip) -> the model name the device readings carry, for families read by other
    sources (ECC, throttle, links) so that every family of one device has the same ``model`` label."""
    out: dict[tuple[str, int, int], str] = {}
    for poller in pollers:
        for r in poller.snapshot().readings:
            name = getattr(r, "name", None)
            if isinstance(r, DeviceReading) and name:
                out[(r.vendor, r.device_id, r.chip_id)] = str(name)
    return out


class DeviceCollector:
    """Yields npudist_device_* families from every poller's snapshot; a field that cannot be exported
    (not a finite number) is counted as a ``collect`` error of its poller and has no sample."""

    def __init__(self, pollers: Sequence[Poller], health: CollectorHealth, node: str | None = None) -> None:
        self.pollers = list(pollers)
        self.health = health
        self.node = node or node_name()

    def collect(self) -> Iterator[Metric]:
        up, info = family("npudist_device_up"), family("npudist_device_info")
        values = {name: family(name) for name, _ in FIELDS}
        for poller in self.pollers:
            snap = poller.snapshot()
            for r in snap.readings:
                try:
                    labels = device_labels(self.node, r)
                    raw = [(name, getattr(r, attr)) for name, attr in FIELDS]
                    info_labels = [*labels, _text(r.health), _text(r.bus_id), _text(r.logical_id)]
                except (TypeError, ValueError, AttributeError):
                    self.health.error(poller.name, "collect")
                    continue
                samples = [(name, x) for name, value in raw if (x := exportable(value)) is not None]
                if len(samples) < sum(finite(value) for _, value in raw):
                    self.health.error(poller.name, "collect")
                up.add_metric(labels, 1.0 if snap.fresh else 0.0)
                _add_info(info, info_labels)
                for name, value in samples:
                    values[name].add_metric(labels, value)
        yield up
        yield info
        yield from values.values()
