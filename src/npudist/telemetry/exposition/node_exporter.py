"""`npudist exporter`: the node-level device exporter (DaemonSet or systemd unit)."""

from __future__ import annotations

import re
import signal
import threading
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client import CollectorRegistry

from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.device_metrics import DeviceCollector
from npudist.telemetry.exposition.server import ExporterError, MetricsServer, parse_listen, serve
from npudist.telemetry.sources.poller import Poller
from npudist.telemetry.sources.readings import Source
from npudist.telemetry.sources.registry import SourceUnavailable, load_source

__all__ = ["ExporterError", "NodeExporter", "SourceUnavailable", "build", "parse_interval", "start"]

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


def build(sources: list[Source], interval_s: float, node: str | None = None,
          timeout_s: float | None = None) -> NodeExporter:
    """Registry with one poller per source and the self-monitoring metrics; nothing started yet."""
    health = CollectorHealth()
    pollers = [Poller(s, health, interval_s=interval_s, timeout_s=timeout_s) for s in sources]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeviceCollector(pollers, health, node))
    registry.register(health)
    return NodeExporter(registry, health, pollers)


def start(listen: str, source: str, interval: str) -> NodeExporter:
    """Validate the options, start polling and serve; ExporterError/SourceUnavailable say what is wrong."""
    host, port = parse_listen(listen)
    interval_s = parse_interval(interval)
    exporter = build([load_source(source)], interval_s)
    exporter.server = serve(exporter.registry, host, port)
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
