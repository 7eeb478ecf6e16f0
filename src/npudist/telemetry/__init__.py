"""Telemetry: device sources, training-loop metrics and one Prometheus exporter."""

from npudist.telemetry.rank import RankTelemetry, serve_rank_metrics
from npudist.telemetry.readings import DeviceReading, ParseError, ProcessReading, Source, SourceError
from npudist.telemetry.training import StepTimer, TrainingMetrics, watch_ddp

__all__ = [
    "DeviceReading",
    "ParseError",
    "ProcessReading",
    "RankTelemetry",
    "Source",
    "SourceError",
    "StepTimer",
    "TrainingMetrics",
    "serve_rank_metrics",
    "watch_ddp",
]
