"""Telemetry: device sources, training-loop metrics and one Prometheus exporter."""

from npudist.telemetry.exposition.rank_exporter import RankTelemetry, serve_rank_metrics
from npudist.telemetry.job.detector import StragglerDetector
from npudist.telemetry.job.step_timer import StepTimer, TrainingMetrics, watch_ddp
from npudist.telemetry.sources.readings import DeviceReading, ParseError, ProcessReading, Source, SourceError

__all__ = [
    "DeviceReading",
    "ParseError",
    "ProcessReading",
    "RankTelemetry",
    "Source",
    "SourceError",
    "StepTimer",
    "StragglerDetector",
    "TrainingMetrics",
    "serve_rank_metrics",
    "watch_ddp",
]
