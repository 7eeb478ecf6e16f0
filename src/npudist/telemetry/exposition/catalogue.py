"""Every metric npudist exports, as data: the single source of truth for collectors, docs and dashboards.

Collectors build their families from these rows (``family()``), so a name, type, help text or label set
cannot drift between the exporter, the docs/reference/telemetry.md table and dashboard queries. Rows are checked by
``validate()`` (a test runs it) against Prometheus naming practice (metric_def.py). The row type and label
sets are metric_def.py's, the reliability and network rows reliability_rows.py's; both are served from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from npudist.telemetry.exposition import metric_def
from npudist.telemetry.exposition.metric_def import (
    BASE_UNITS,
    DEVICE_LABELS,
    LINK_LABELS,
    RANK_LABELS,
    TYPES,
    MetricDef,
    rank_label_values,
)
from npudist.telemetry.exposition.reliability_rows import RELIABILITY_ROWS

if TYPE_CHECKING:
    from prometheus_client.core import Metric

__all__ = ["BASE_UNITS", "BY_NAME", "CATALOGUE", "DEVICE_LABELS", "LINK_LABELS", "RANK_LABELS", "RELIABILITY_ROWS",
           "TYPES", "MetricDef", "family", "markdown_table", "problems", "rank_label_values", "validate"]

_DEV = "device source (npu-smi, rknpu, NVML, cpu)"


CATALOGUE: tuple[MetricDef, ...] = (
    MetricDef("npudist_device_up", "gauge", "",
              "1 when the latest device read listed this device, 0 when that read failed or is stale.",
              DEVICE_LABELS, _DEV),
    MetricDef("npudist_device_info", "gauge", "",
              "Always 1; labels carry the device's health, bus id and logical index.",
              (*DEVICE_LABELS, "health", "bus_id", "logical_id"), _DEV),
    MetricDef("npudist_device_utilization_ratio", "gauge", "ratio",
              "Compute-unit (AI core, SM, NPU core) busy fraction, 0-1.", DEVICE_LABELS, _DEV),
    MetricDef("npudist_device_memory_used_bytes", "gauge", "bytes",
              "Device main memory in use (HBM where the device has it, else DDR).", DEVICE_LABELS, _DEV),
    MetricDef("npudist_device_memory_total_bytes", "gauge", "bytes",
              "Device main memory capacity (HBM where the device has it, else DDR).", DEVICE_LABELS, _DEV),
    MetricDef("npudist_device_power_watts", "gauge", "watts", "Device power draw.", DEVICE_LABELS, _DEV),
    MetricDef("npudist_device_temperature_celsius", "gauge", "celsius", "Device temperature.",
              DEVICE_LABELS, _DEV),
    MetricDef("npudist_device_frequency_hertz", "gauge", "hertz", "Device compute clock frequency.",
              DEVICE_LABELS, _DEV),
    MetricDef("npudist_allocator_allocated_bytes", "gauge", "bytes",
              "Bytes held by live tensors in this rank's caching allocator.", RANK_LABELS,
              "torch device module memory_allocated()"),
    MetricDef("npudist_allocator_reserved_bytes", "gauge", "bytes",
              "Bytes the caching allocator holds from the device (allocated plus cached).", RANK_LABELS,
              "torch device module memory_reserved()"),
    MetricDef("npudist_allocator_fragmentation_ratio", "gauge", "ratio",
              "1 - allocated/reserved: share of reserved memory not held by tensors (no sample when "
              "nothing is reserved).", RANK_LABELS, "computed from the two allocator readings"),
    MetricDef("npudist_step_duration_seconds", "histogram", "seconds", "Wall time of one training step.",
              RANK_LABELS, "StepTimer"),
    MetricDef("npudist_steps_total", "counter", "", "Training steps completed by this rank.", RANK_LABELS,
              "StepTimer"),
    MetricDef("npudist_training_loss", "gauge", "",
              "The training loss the loop last reported (RankTelemetry.training_progress).", RANK_LABELS,
              "training loop"),
    MetricDef("npudist_training_samples_per_second", "gauge", "",
              "Samples per second over the loop's last logging window (RankTelemetry.training_progress).",
              RANK_LABELS, "training loop"),
    MetricDef("npudist_training_scalar", "gauge", "",
              "A number the script logged with npudist.log, by name (its last value at a logged step; at most "
              "32 names a rank).", (*RANK_LABELS, "name"), "training loop"),
    MetricDef("npudist_step_skew_ratio", "gauge", "ratio",
              "Standard deviation / mean of the ranks' mean step times over the last window (rank 0 only).",
              RANK_LABELS, "StepTimer all_gather every N steps"),
    MetricDef("npudist_straggler_rank", "gauge", "",
              "Rank the straggler detector flags with the largest slowdown over the last window (rank 0 only; "
              "absent while no rank is flagged).", RANK_LABELS, "StepTimer all_gather + StragglerDetector"),
    MetricDef("npudist_rank_slowdown_ratio", "gauge", "ratio",
              "This rank's mean work time over the last window divided by the median of the other ranks'.",
              RANK_LABELS, "StepTimer all_gather + StragglerDetector"),
    MetricDef("npudist_rank_straggler", "gauge", "",
              "1 while the straggler detector flags this rank, else 0.", RANK_LABELS,
              "StepTimer all_gather + StragglerDetector"),
    MetricDef("npudist_rank_phase_seconds_total", "counter", "seconds",
              "Seconds of this rank's training steps in each phase (data, compute, comm_wait, comm_transfer, "
              "other); the phases of a step sum to its npudist_step_duration_seconds (diagnosis/straggler/"
              "phases.py).", (*RANK_LABELS, "phase"), "StepTimer: DataLoader hook, DDP bucket wait or the "
              "process-group watch, all_gather"),
    MetricDef("npudist_op_duration_seconds", "histogram", "seconds",
              "Self time of one operator call in a profiled step, by operator family.",
              (*RANK_LABELS, "op"), "torch.profiler, one step every M steps"),
    MetricDef("npudist_collective_calls_total", "counter", "", "Collective calls issued.",
              (*RANK_LABELS, "op", "backend"), "npudist.comm.stats()"),
    MetricDef("npudist_collective_bytes_total", "counter", "bytes", "Payload bytes passed to collectives.",
              (*RANK_LABELS, "op", "backend"), "npudist.comm.stats()"),
    MetricDef("npudist_collective_duration_seconds", "histogram", "seconds",
              "Time from issuing a collective to its completion.", (*RANK_LABELS, "op", "backend"),
              "npudist.comm.stats()"),
    MetricDef("npudist_collective_inflight", "gauge", "",
              "Async collective handles issued and not yet waited.", (*RANK_LABELS, "op", "backend"),
              "npudist.comm.stats()"),
    MetricDef("npudist_collective_adaptations_total", "counter", "",
              "Tensor adaptations made so a backend accepts the call (cast, contiguous, pad, align, stage).",
              (*RANK_LABELS, "op", "backend", "kind"), "npudist.comm.stats()"),
    MetricDef("npudist_hang_stall_seconds", "gauge", "seconds",
              "Seconds since any rank's collective progress, as the job's hang reader sees it (rank 0 only); "
              "a hang verdict comes when it passes the bound (NPUDIST_HANG_TIMEOUT or deduced).", RANK_LABELS,
              "rank 0's watchdog thread, one store read a second"),
    MetricDef("npudist_rank_store_rtt_seconds", "gauge", "seconds",
              "Median of this rank's last 8 round trips to the job's store (on the master's node): a rank "
              "behind a slow or lossy link sees it in every one, while its step times stay level with the others'.",
              RANK_LABELS, "the watchdog thread's control poll, one a second"),
    MetricDef("npudist_checkpoint_snapshot_duration_seconds", "histogram", "seconds",
              "Time a checkpoint save held the training loop: the host copy of the state for asynchronous "
              "saves (plus any wait for the previous write), the whole save for synchronous ones.",
              RANK_LABELS, "npudist.checkpoint.stats()"),
    MetricDef("npudist_checkpoint_write_duration_seconds", "histogram", "seconds",
              "Time to write, fsync, checksum and publish one checkpoint (in the background when "
              "asynchronous).", RANK_LABELS, "npudist.checkpoint.stats()"),
    MetricDef("npudist_checkpoint_bytes_total", "counter", "bytes",
              "Bytes of checkpoints published by this rank (rank 0 counts every rank's shard files).",
              RANK_LABELS, "npudist.checkpoint.stats()"),
    MetricDef("npudist_checkpoint_inflight", "gauge", "",
              "Background checkpoint writes in progress (0 or 1).", RANK_LABELS, "npudist.checkpoint.stats()"),
    MetricDef("npudist_checkpoint_waits_total", "counter", "",
              "Saves that waited for the previous background write to finish (checkpoints due faster "
              "than storage writes them).", RANK_LABELS, "npudist.checkpoint.stats()"),
    MetricDef("npudist_checkpoint_failures_total", "counter", "",
              "Checkpoint writes that failed (full disk, permissions, ...); the previous checkpoint stays "
              "the newest good one.", RANK_LABELS, "npudist.checkpoint.stats()"),
    MetricDef("npudist_peer_snapshot_age_steps", "gauge", "",
              "Steps run since the newest in-memory copy of this rank's state that its partner's node holds "
              "(npudist launch --peer-snapshots K); a restart now would lose this many.", RANK_LABELS,
              "npudist.checkpoint.stats()"),
    MetricDef("npudist_peer_snapshot_interval_steps", "gauge", "",
              "Steps between this rank's in-memory snapshots (K of npudist launch --peer-snapshots K): the age "
              "above goes up to K-1 between snapshots, and past 2K only when copies stopped reaching the partner.",
              RANK_LABELS, "npudist.checkpoint.stats()"),
    MetricDef("npudist_peer_snapshot_bytes", "gauge", "bytes",
              "Size of this rank's newest in-memory copy (its partner's node holds up to two).", RANK_LABELS,
              "npudist.checkpoint.stats()"),
    MetricDef("npudist_peer_snapshot_blocking_seconds_total", "counter", "seconds",
              "Time in-memory snapshots held the training loop (staging the host copy).", RANK_LABELS,
              "npudist.checkpoint.stats()"),
    MetricDef("npudist_peer_snapshot_failures_total", "counter", "",
              "In-memory copies that did not reach the partner's holder (training went on; disk remains).",
              RANK_LABELS, "npudist.checkpoint.stats()"),
    MetricDef("npudist_recoveries_total", "counter", "",
              "Restarts by where the resumed state came from: peer-memory, local-memory or disk.",
              (*RANK_LABELS, "source"), "npudist.checkpoint.stats()"),
    MetricDef("npudist_edge_inference_duration_seconds", "histogram", "seconds",
              "Time this rank's ensemble member takes from input to logits (one request's batch).",
              (*RANK_LABELS, "runtime", "core_mask"), "EnsembleServer.stats (npudist.infer)"),
    MetricDef("npudist_edge_inference_failures_total", "counter", "",
              "Requests this rank's ensemble member failed (the runtime returned nothing, raised, or the "
              "wrong shape).", (*RANK_LABELS, "runtime", "core_mask"), "EnsembleServer.stats (npudist.infer)"),
    MetricDef("npudist_edge_runtime_info", "gauge", "",
              "Always 1; labels name this rank's member runtime (torch, rknnlite, rknn-sim) and the NPU "
              "core mask it runs with (auto, 0, 0_1, 0_1_2, all; none off an NPU).",
              (*RANK_LABELS, "runtime", "core_mask"), "EnsembleServer.stats (npudist.infer)"),
    MetricDef("npudist_edge_members_expected", "gauge", "",
              "Members of the ensemble behind this fan-out front (rank 0 with --member-host), its own included.",
              RANK_LABELS, "EnsembleServer.stats (npudist.infer.fanout)"),
    MetricDef("npudist_edge_members_answering", "gauge", "",
              "Members combined into the front's latest answer (or answering its latest idle probe); below "
              "npudist_edge_members_expected the answers are degraded.", RANK_LABELS,
              "EnsembleServer.stats (npudist.infer.fanout)"),
    MetricDef("npudist_edge_degraded_answers_total", "counter", "",
              "Answers the fan-out front combined from fewer members than the ensemble has (a member lost, "
              "late or failing); each such answer says degraded and names the missing members.", RANK_LABELS,
              "EnsembleServer.stats (npudist.infer.fanout)"),
    MetricDef("npudist_collector_errors_total", "counter", "",
              "Failed reads by collector and reason (timeout, too_large, exit_code, parse, missing, config, error).",
              ("collector", "reason"), "exporter self-monitoring"),
    MetricDef("npudist_collector_last_success_timestamp_seconds", "gauge", "seconds",
              "Unix time of the collector's last successful read.", ("collector",),
              "exporter self-monitoring"),
    MetricDef("npudist_collector_duration_seconds", "gauge", "seconds",
              "Duration of the collector's last read, successful or not.", ("collector",),
              "exporter self-monitoring"),
    *RELIABILITY_ROWS,
)

BY_NAME: Mapping[str, MetricDef] = MappingProxyType({m.name: m for m in CATALOGUE})


def problems(rows: Iterable[MetricDef] = CATALOGUE) -> list[str]:
    """Every naming rule a row breaks, as readable lines (empty when the catalogue is sound)."""
    return metric_def.problems(rows)


def validate(rows: Iterable[MetricDef] = CATALOGUE) -> None:
    """Raise ValueError listing every broken naming rule."""
    metric_def.validate(rows)


def family(name: str, extra_labels: Sequence[str] = ()) -> Metric:
    """A fresh, empty family for catalogue row ``name``; collectors add samples in the row's label order."""
    # Imported here: the catalogue alone (help, dashboards, docs) does not need the client.
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    m = BY_NAME[name]
    labels = [*m.labels, *extra_labels]
    if m.type == "counter":
        return CounterMetricFamily(m.name, m.help, labels=labels)
    if m.type == "histogram":
        return HistogramMetricFamily(m.name, m.help, labels=labels, unit="")
    return GaugeMetricFamily(m.name, m.help, labels=labels)


def markdown_table(rows: Iterable[MetricDef] = CATALOGUE) -> str:
    """The docs/reference/telemetry.md metric table (name, type, unit, labels, source), generated so it cannot drift."""
    lines = ["| name | type | unit | labels | source |", "|---|---|---|---|---|"]
    for m in rows:
        lines.append(f"| `{m.name}` | {m.type} | {m.unit or '-'} | {', '.join(m.labels)} | {m.source} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - `python -m npudist.telemetry.exposition.catalogue`
    print(markdown_table(), end="")
