"""Telemetry: device sources, training-loop metrics and one Prometheus exporter."""

from npudist.telemetry.readings import DeviceReading, ParseError, ProcessReading, Source, SourceError

__all__ = ["DeviceReading", "ParseError", "ProcessReading", "Source", "SourceError"]
