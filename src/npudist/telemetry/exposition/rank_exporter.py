"""Per-rank metrics: training, allocator and collective collectors served on base_port + local_rank.

Every rank metric carries rank, local_rank, node, run (run_label.py), and the physical ``device``/``chip``
the rank computes on, with the values the device metrics use for that card (npu-smi NPU ID and chip), so a
query can join a rank to its own device: ``... and on (node, device, chip) npudist_steps_total{rank="3"}``. The device
source finds them (npu-smi: ``info -m`` plus ASCEND_RT_VISIBLE_DEVICES); where it cannot, they are empty.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from npudist.runtime.settings import PORT_VAR, Settings, SettingsError
from npudist.runtime.state import current, peek
from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.node_label import node_name
from npudist.telemetry.exposition.run_label import run_id
from npudist.telemetry.exposition.server import DEFAULT_HOST, ExporterError, MetricsServer, check_port, serve
from npudist.telemetry.job.allocator import AllocatorCollector
from npudist.telemetry.job.checkpoint_metrics import CheckpointCollector
from npudist.telemetry.job.comm_metrics import CommCollector
from npudist.telemetry.job.progress import ProgressMetrics
from npudist.telemetry.job.step_timer import StepTimer, TrainingMetrics
from npudist.telemetry.sources.host_psutil import HostSource
from npudist.telemetry.sources.poller import Poller
from npudist.telemetry.sources.readings import DeviceReading, RankDevice, Source, SourceError

log = logging.getLogger("npudist.telemetry")

VITALS_INTERVAL_S = 15.0
LOCATE = "rank_device"
"""Collector name under which a failed device lookup is counted (npudist_collector_errors_total)."""


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
    device: RankDevice | None = None
    """The physical device this rank computes on, when the device source can tell."""
    progress: ProgressMetrics | None = None
    timer_made: Callable[[StepTimer], None] | None = None
    """Told of each StepTimer made here: the watched loop (npudist.training) then leaves the timing to it."""

    def training_progress(self, *, loss: float | None = None, samples_per_second: float | None = None) -> None:
        """Export the loop's loss and throughput (npudist_training_loss, npudist_training_samples_per_second);
        call it where the loop logs them."""
        if self.progress is not None:
            self.progress.report(loss=loss, samples_per_second=samples_per_second)

    def vitals(self) -> tuple[float | None, float | None, float | None]:
        """This rank's device temperature, frequency and utilization from the last device read."""
        if self.poller is None:
            return None, None, None
        reading = local_reading(self.poller.snapshot().readings, self.local_rank, self.device)
        if reading is None:
            return None, None, None
        return reading.temperature_celsius, reading.frequency_hertz, reading.utilization_ratio

    def step_timer(self, **kwargs: Any) -> StepTimer:
        """A StepTimer recording into this rank's metrics (keywords as StepTimer's)."""
        kwargs.setdefault("device_type", self.device_type)
        kwargs.setdefault("vitals", self.vitals)
        kwargs.setdefault("synchronize", self.synchronize)
        kwargs.setdefault("rank_device", self.device)
        timer = StepTimer(self.training, **kwargs)
        if self.timer_made is not None:
            self.timer_made(timer)
        return timer

    def close(self) -> None:
        """Stop the server and the poller (their threads joined); safe to call again. ``npudist.shutdown()``
        calls it for every RankTelemetry this process started."""
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.poller is not None:
            self.poller.stop()
            self.poller = None


def local_reading(readings: tuple[DeviceReading, ...], local_rank: int,
                  device: RankDevice | None = None) -> DeviceReading | None:
    """The reading of this rank's device: the located one (``device``) when known; else logical id = local
    rank when the source knows it, else the local_rank-th device listed (NVML, rknpu). The host source's one
    reading (vendor "cpu") is every CPU rank's: rank 1 had none, so its straggler line said "frequency n/a"
    and its run log had no CPU utilization."""
    if device is not None:
        return next((r for r in readings if (r.device_id, r.chip_id) == (device.device_id, device.chip_id)), None)
    if len(readings) == 1 and readings[0].vendor == HostSource.vendor:
        return readings[0]
    for r in readings:
        if r.logical_id == local_rank:
            return r
    chip0 = [r for r in readings if r.logical_id is None]
    return chip0[local_rank] if local_rank < len(chip0) else None


def _settings(env: Mapping[str, str]) -> Settings:
    try:
        return Settings.from_env(env)
    except SettingsError as exc:
        raise ExporterError(str(exc)) from None


def metrics_port(env: Mapping[str, str]) -> int | None:
    port = _settings(env).metrics_port
    if port is None:
        return None
    check_port(port, PORT_VAR, allow_zero=True)  # 0: any free port (tests, single-process notebooks)
    return port


def serve_rank_metrics(ctx: Any = None, *, env: Mapping[str, str] | None = None,
                       device_source: str | None = "auto") -> RankTelemetry:
    """Build this rank's registry and, when NPUDIST_METRICS_PORT is set, serve it on port + local_rank.

    ``ctx`` is the DistContext from npudist.init() (None: a single process, rank 0). ``device_source``
    names the source asked once which physical device the rank uses (the device/chip labels, the straggler
    diagnosis) and polled every 15 s for the temperature/frequency in skew warnings (None: neither; a
    source that cannot load is skipped). ``close()`` it when training ends, or leave that to
    ``npudist.shutdown()``, which closes it with the Runtime. Where ``npudist.init()`` already started this
    rank's metrics (the watched loop, npudist.training), that RankTelemetry is returned: one port per rank.
    """
    env = os.environ if env is None else env
    rank, local_rank = (ctx.rank, ctx.local_rank) if ctx is not None else (0, 0)
    loop = getattr(peek(), "loop", None)
    started = getattr(loop, "telemetry", None)
    if started is not None and started.local_rank == local_rank:
        if device_source == "auto":
            return started
        started.close()  # another device source asked for: rebuilt below, on the same port, for the loop too
    device_type = ctx.device.type if ctx is not None else "cpu"
    health = CollectorHealth()
    try:
        runtime = current()  # the Runtime owns what this starts: shutdown() closes it (CLOSE_ORDER)
    except SettingsError as exc:
        raise ExporterError(str(exc)) from None
    source = _device_source(device_source) if device_source is not None else None
    device = None
    if source is not None:
        index = ctx.device.index if ctx is not None and ctx.device.index is not None else local_rank
        device = locate(source, env, index, health)
    labels = rank_labels(rank, local_rank, node_name(env), device, run_id(env))
    training = TrainingMetrics(labels)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(training)
    registry.register(health)
    if ctx is not None:
        acc, index = ctx.accelerator, ctx.device.index
        registry.register(AllocatorCollector(lambda: acc.memory_stats(index), health, labels))
    registry.register(CommCollector(health, labels))
    registry.register(CheckpointCollector(health, labels))
    progress = ProgressMetrics(labels)
    registry.register(progress)
    telemetry = RankTelemetry(registry, health, training, device_type, local_rank, device=device,
                              progress=progress)
    runtime.own("telemetry", telemetry.close)
    if ctx is not None and device_type != "cpu":
        telemetry.synchronize = lambda: ctx.accelerator.synchronize(ctx.device.index)
    port = metrics_port(env)
    if port is not None:
        host = _settings(env).metrics_host or DEFAULT_HOST
        telemetry.server = serve(registry, host, port and port + local_rank)
        log.info("rank %d metrics at %s", rank, telemetry.server.url)
    if source is not None:
        telemetry.poller = Poller(source, health, interval_s=VITALS_INTERVAL_S, timeout_s=5.0).start()
    if started is not None and started.local_rank == local_rank:
        loop.replace_telemetry(telemetry)
    return telemetry


def rank_labels(rank: int, local_rank: int, node: str, device: RankDevice | None, run: str = "") -> list[str]:
    """Label values in catalogue.RANK_LABELS order; device, chip and run empty when unknown."""
    where = ("", "") if device is None else (str(device.device_id), str(device.chip_id))
    return [str(rank), str(local_rank), node, *where, run]


def locate(source: Source, env: Mapping[str, str], index: int, health: CollectorHealth) -> RankDevice | None:
    """The device behind this rank's device index; a failure is logged and counted, never raised (the
    rank's metrics then carry empty device/chip labels)."""
    try:
        return source.locate(env, index)
    except SourceError as exc:
        health.error(LOCATE, exc.reason)
        log.warning("rank metrics without device/chip labels: %s", exc)
    except ValueError as exc:  # a visible-devices variable naming no device of this node
        health.error(LOCATE, "config")
        log.warning("rank metrics without device/chip labels: %s", exc)
    return None


def _device_source(name: str) -> Source | None:
    from npudist.telemetry.sources.registry import SourceUnavailable, load_source

    try:
        return load_source(name)
    except SourceUnavailable as exc:
        log.debug("no device source for vitals and device labels: %s", exc)
        return None
