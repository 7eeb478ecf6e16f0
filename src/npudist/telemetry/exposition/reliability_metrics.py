"""Reliability and network families (ECC, alarms, per-core utilization, links, RoCE/PFC, optics) from the
sweep pollers' last good snapshots of ChipMeasurements, labelled like the device metrics plus the NIC."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import Metric

from npudist.telemetry.exposition.catalogue import BY_NAME, DEVICE_LABELS, LINK_LABELS, RELIABILITY_ROWS, family
from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.device_metrics import exportable, models
from npudist.telemetry.exposition.node_label import node_name
from npudist.telemetry.exposition.selection import Selection
from npudist.telemetry.sources.measurements import ChipMeasurements
from npudist.telemetry.sources.poller import Poller


class ReliabilityCollector:
    """Yields every switched-on reliability family (empty ones too, so their HELP stays visible); a value
    that is not a finite number is counted as a ``collect`` error of its poller and has no sample."""

    def __init__(self, pollers: Sequence[Poller], health: CollectorHealth, selection: Selection,
                 node: str | None = None, device_pollers: Sequence[Poller] = ()) -> None:
        self.pollers = list(pollers)
        self.device_pollers = list(device_pollers)
        """The device source's pollers: their readings name each device's model."""
        self.health = health
        self.selection = selection
        self.node = node or node_name()
        self._rows = [r for r in RELIABILITY_ROWS if selection.on(r.name)]

    def collect(self) -> Iterator[Metric]:
        families = {r.name: family(r.name) for r in self._rows}
        named = models(self.device_pollers)
        for poller in self.pollers:
            for chip in poller.snapshot().readings:
                if isinstance(chip, ChipMeasurements):
                    self._add(poller.name, chip, families, named.get((chip.vendor, chip.device_id, chip.chip_id), ""))
        yield from families.values()

    def _add(self, source: str, chip: ChipMeasurements, families: dict[str, Metric], model: str) -> None:
        device = [self.node, chip.vendor, str(chip.device_id), str(chip.chip_id), model]
        for x in chip.measurements:
            fam = families.get(x.metric)
            if fam is None:
                continue  # switched off
            value = exportable(x.value)
            if value is None:
                self.health.error(source, "collect")
                continue
            row = BY_NAME[x.metric]
            base = len(LINK_LABELS) if x.metric.startswith("npudist_link_") else len(DEVICE_LABELS)
            own = dict(x.labels)
            nic_port = [chip.nic, own.pop("port", "")] if base == len(LINK_LABELS) else []
            fam.add_metric([*device, *nic_port, *(own.get(n, "") for n in row.labels[base:])], value)
