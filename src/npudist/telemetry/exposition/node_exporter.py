"""`npudist exporter`: the node-level device exporter (DaemonSet or systemd unit)."""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client import CollectorRegistry

from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.device_metrics import DeviceCollector
from npudist.telemetry.exposition.reliability_metrics import ReliabilityCollector
from npudist.telemetry.exposition.selection import Selection, SelectionError, parse_selection, read_selection_file
from npudist.telemetry.exposition.server import ExporterError, MetricsServer, parse_listen, serve
from npudist.telemetry.sources.measurements import ChipMeasurements
from npudist.telemetry.sources.poller import Poller
from npudist.telemetry.sources.readings import Source
from npudist.telemetry.sources.registry import SourceUnavailable, load_source, resolve_name

__all__ = ["ExporterError", "NodeExporter", "SourceUnavailable", "build", "collectors", "parse_interval", "start"]

_UNITS = MappingProxyType({"ms": 0.001, "s": 1.0, "m": 60.0, "": 1.0})


def parse_interval(text: str) -> float:
    """``5s``, ``500ms``, ``1m`` or a bare number of seconds -> seconds."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|)\s*", text)
    if m is None or float(m.group(1)) <= 0:
        raise ExporterError(f"--interval {text!r}: give a positive duration such as 5s, 500ms or 1m")
    return float(m.group(1)) * _UNITS[m.group(2)]


@dataclass
class NodeExporter:
    registry: CollectorRegistry
    health: CollectorHealth
    pollers: list[Poller]
    server: MetricsServer | None = None

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for p in self.pollers:
            p.stop(0.5)


SWEEP_MIN_INTERVAL_S = 15.0
"""Reliability sweeps (dozens of tool calls per node) run at most this often: ECC counts, link state and
optics change slowly, and npu-smi/hccn_tool are slow to start."""
SERIES_BUDGET_PER_NODE = 1200
"""Reliability series one node may serve with every collector on (8 chips: benchmarks/series_budget.py measures it
and a test holds it); a site over budget switches families off with --collectors."""
RENDER_MAX_AGE_S = 1.0
"""A node exporter answers from a render at most this old (twice that while a fresh one renders): its data
changes once per poll, and re-rendering ~1000 reliability series for each of many scrapers would not."""
SWEEP_CALL_TIMEOUT_S = 5.0
"""Hard limit on one npu-smi/hccn_tool call of a sweep (then its process group is killed)."""


def build(sources: list[Source], interval_s: float, node: str | None = None,
          timeout_s: float | None = None, sweeps: Callable[[CollectorHealth], list[Source]] | None = None,
          selection: Selection | None = None) -> NodeExporter:
    """Registry with one poller per source, one per reliability sweep (``sweeps(health)`` builds them) and
    the self-monitoring metrics; nothing started yet."""
    health = CollectorHealth()
    pollers = [Poller(s, health, interval_s=interval_s, timeout_s=timeout_s) for s in sources]
    sweep_interval = max(interval_s, SWEEP_MIN_INTERVAL_S)
    sweep_pollers = [Poller(s, health, interval_s=sweep_interval, timeout_s=sweep_interval,
                            record=ChipMeasurements) for s in (sweeps(health) if sweeps else [])]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeviceCollector(pollers, health, node))
    if sweep_pollers and selection is not None:
        registry.register(ReliabilityCollector(sweep_pollers, health, selection, node, device_pollers=pollers))
    registry.register(health)
    return NodeExporter(registry, health, pollers + sweep_pollers)


def collectors() -> dict[str, tuple[str, ...]]:
    """Every switchable collector: {name: the families it serves}."""
    from npudist.telemetry.sources.ascend_sweep import QUERIES
    from npudist.telemetry.sources.nvml_reliability import NVML_COLLECTORS

    return {**{q.name: q.families for q in QUERIES}, **NVML_COLLECTORS}


def selection_from(spec: str | None, file: str | None) -> Selection:
    """The --collectors/--collectors-file choice (default: everything on); ExporterError when invalid."""
    try:
        entries = read_selection_file(file) if file else []
        return parse_selection([*entries, *(spec.split(",") if spec else [])], collectors())
    except SelectionError as exc:
        raise ExporterError(str(exc)) from None


def _sweeps(source: str, selection: Selection, timeout_s: float) -> Callable[[CollectorHealth], list[Source]]:
    """The reliability sweeps for the device source in use (npu-smi: Ascend, nvml: NVIDIA; none else)."""
    def make(health: CollectorHealth) -> list[Source]:
        if source == "npu-smi":
            from npudist.telemetry.sources.ascend_sweep import ascend_sweeps

            return list(ascend_sweeps(health, lambda q: selection.any_on(q.families), timeout=timeout_s))
        if source == "nvml":
            from npudist.telemetry.sources.nvml_reliability import NvmlReliabilitySource

            source_ = NvmlReliabilitySource(selection=selection)
            return [source_] if source_.collectors else []
        return []
    return make


def start(listen: str, source: str, interval: str, collectors_spec: str | None = None,
          collectors_file: str | None = None) -> NodeExporter:
    """Validate the options, start polling and serve; ExporterError/SourceUnavailable say what is wrong."""
    host, port = parse_listen(listen)
    interval_s = parse_interval(interval)
    selection = selection_from(collectors_spec, collectors_file)
    device_source = load_source(source)
    name = resolve_name(source)
    exporter = build([device_source], interval_s, sweeps=_sweeps(name, selection, SWEEP_CALL_TIMEOUT_S),
                     selection=selection)
    exporter.server = serve(exporter.registry, host, port, max_age_s=RENDER_MAX_AGE_S)
    for p in exporter.pollers:
        p.start()
    return exporter


def run_forever(exporter: NodeExporter) -> None:
    """Block until SIGTERM or SIGINT, then stop cleanly (systemd and Kubernetes stop with SIGTERM)."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        done.wait()
    finally:
        exporter.close()
