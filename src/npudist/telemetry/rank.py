"""Per-rank metrics: training, allocator and collective collectors served on base_port + local_rank."""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from npudist.telemetry.allocator import AllocatorCollector
from npudist.telemetry.checkpoints import CheckpointCollector
from npudist.telemetry.collectives import CommCollector
from npudist.telemetry.health import CollectorHealth
from npudist.telemetry.poller import Poller
from npudist.telemetry.readings import DeviceReading
from npudist.telemetry.server import DEFAULT_HOST, ExporterError, MetricsServer, check_port, serve
from npudist.telemetry.training import StepTimer, TrainingMetrics

log = logging.getLogger("npudist.telemetry")

PORT_VAR = "NPUDIST_METRICS_PORT"
HOST_VAR = "NPUDIST_METRICS_HOST"
VITALS_INTERVAL_S = 15.0


@dataclass
class RankTelemetry:
    registry: CollectorRegistry
    health: CollectorHealth
    training: TrainingMetrics
    device_type: str
    local_rank: int
    server: MetricsServer | None = None
    poller: Poller | None = None
    synchronize: Callable[[], None] | None = None
    """Waits for this rank's device (None on CPU), so step times include the device's work."""

    def vitals(self) -> tuple[float | None, float | None, float | None]:
        """This rank's device temperature, frequency and utilization from the last device read."""
        if self.poller is None:
            return None, None, None
        reading = local_reading(self.poller.snapshot().readings, self.local_rank)
        if reading is None:
            return None, None, None
        return reading.temperature_celsius, reading.frequency_hertz, reading.utilization_ratio

    def step_timer(self, **kwargs: Any) -> StepTimer:
        """A StepTimer recording into this rank's metrics (keywords as StepTimer's)."""
        kwargs.setdefault("device_type", self.device_type)
        kwargs.setdefault("vitals", self.vitals)
        kwargs.setdefault("synchronize", self.synchronize)
        return StepTimer(self.training, **kwargs)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.poller is not None:
            self.poller.stop(0.5)
            self.poller = None


def local_reading(readings: tuple[DeviceReading, ...], local_rank: int) -> DeviceReading | None:
    """The reading of this rank's device: logical id = local rank when the source knows it, else the
    local_rank-th device listed (npu-smi ids are labels, not indices: readings.py)."""
    for r in readings:
        if r.logical_id == local_rank:
            return r
    chip0 = [r for r in readings if r.logical_id is None]
    return chip0[local_rank] if local_rank < len(chip0) else None


def metrics_port(env: Mapping[str, str]) -> int | None:
    raw = env.get(PORT_VAR, "").strip()
    if not raw:
        return None
    if not re.fullmatch(r"[0-9]+", raw):
        raise ExporterError(f"{PORT_VAR}={raw!r} is not a port number; unset it or give the base port")
    port = int(raw)
    check_port(port, PORT_VAR, allow_zero=True)  # 0: any free port (tests, single-process notebooks)
    return port


def serve_rank_metrics(ctx: Any = None, *, env: Mapping[str, str] | None = None,
                       device_source: str | None = "auto") -> RankTelemetry:
    """Build this rank's registry and, when NPUDIST_METRICS_PORT is set, serve it on port + local_rank.

    ``ctx`` is the DistContext from npudist.init() (None: a single process, rank 0). ``device_source``
    names the source polled every 15 s for the temperature/frequency in skew warnings (None: no polling;
    a source that cannot load is skipped). Call ``close()`` when training ends.
    """
    env = os.environ if env is None else env
    rank, local_rank = (ctx.rank, ctx.local_rank) if ctx is not None else (0, 0)
    device_type = ctx.device.type if ctx is not None else "cpu"
    labels = [str(rank), str(local_rank), socket.gethostname()]
    health = CollectorHealth()
    training = TrainingMetrics(labels)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(training)
    registry.register(health)
    if ctx is not None:
        acc, index = ctx.accelerator, ctx.device.index
        registry.register(AllocatorCollector(lambda: acc.memory_stats(index), health, labels))
    registry.register(CommCollector(health, labels))
    registry.register(CheckpointCollector(health, labels))
    telemetry = RankTelemetry(registry, health, training, device_type, local_rank)
    if ctx is not None and device_type != "cpu":
        telemetry.synchronize = lambda: ctx.accelerator.synchronize(ctx.device.index)
    port = metrics_port(env)
    if port is not None:
        host = env.get(HOST_VAR, "").strip() or DEFAULT_HOST
        telemetry.server = serve(registry, host, port and port + local_rank)
        log.info("rank %d metrics at %s", rank, telemetry.server.url)
    if device_source is not None:
        telemetry.poller = _vitals_poller(device_source, health)
    return telemetry


def _vitals_poller(name: str, health: CollectorHealth) -> Poller | None:
    from npudist.telemetry.sources import SourceUnavailable, load_source

    try:
        source = load_source(name)
    except SourceUnavailable as exc:
        log.debug("no device vitals for skew warnings: %s", exc)
        return None
    return Poller(source, health, interval_s=VITALS_INTERVAL_S, timeout_s=5.0).start()
