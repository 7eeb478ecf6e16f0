"""Telemetry: device sources, training-loop metrics and one Prometheus exporter.

Names load on first use, so a command that only needs the metric catalogue (help, dashboards) does not pay
for numpy and the rank exporter.
"""

from types import MappingProxyType

from npudist._lazy import exports, listing

_WHERE = MappingProxyType({
    "RankTelemetry": "npudist.telemetry.exposition.rank_exporter",
    "serve_rank_metrics": "npudist.telemetry.exposition.rank_exporter",
    "StragglerDetector": "npudist.telemetry.job.detector",
    "StepTimer": "npudist.telemetry.job.step_timer",
    "TrainingMetrics": "npudist.telemetry.job.step_timer",
    "watch_ddp": "npudist.telemetry.job.step_timer",
    "DeviceReading": "npudist.telemetry.sources.readings",
    "ParseError": "npudist.telemetry.sources.readings",
    "ProcessReading": "npudist.telemetry.sources.readings",
    "Source": "npudist.telemetry.sources.readings",
    "SourceError": "npudist.telemetry.sources.readings",
})

__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
__dir__ = listing(__name__, _WHERE)
