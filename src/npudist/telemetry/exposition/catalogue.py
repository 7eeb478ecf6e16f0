"""Every metric npudist exports, as data: the single source of truth for collectors, docs and dashboards.

Collectors build their families from these rows (``family()``), so a name, type, help text or label set
cannot drift between the exporter, the docs/reference/telemetry.md table and dashboard queries. Rows are checked by
``validate()`` (a test runs it) against Prometheus naming practice: base units, the unit as the
name's suffix, ``_total`` on counters (https://prometheus.io/docs/practices/naming/).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.core import Metric

BASE_UNITS = ("seconds", "bytes", "watts", "celsius", "ratio", "hertz", "volts", "amperes", "bytes_per_second",
              "decibels")
# decibels: a signal-to-noise ratio as optical modules print it (a logarithmic ratio has no linear base).
TYPES = ("gauge", "counter", "histogram")

DEVICE_LABELS = ("node", "vendor", "device", "chip", "model")
# `job` is not exposed by the ranks: Prometheus sets it at scrape time (from the scrape config or the
# file_sd targets file `npudist launch` writes); an exposed `job` would be renamed to `exported_job`.
# `device` and `chip` name the physical device the rank computes on with the device metrics' values (npu-smi
# NPU ID and chip), so queries join a rank to its device on (node, device, chip); empty when unknown.
# `run` tells two runs of one job apart (run_label.py: NPUDIST_RUN_ID, Slurm job id, rendezvous id, run dir).
RANK_LABELS = ("rank", "local_rank", "node", "device", "chip", "run")
# A device's RoCE NIC: `nic` is hccn_tool's -i (the /etc/hccn.conf address_N index), `port` the port where the
# tool prints one (Ascend 950 tables), else empty.
LINK_LABELS = (*DEVICE_LABELS, "nic", "port")


def rank_label_values(values: Sequence[str]) -> list[str]:
    """``values`` as a list, refused unless there is one per RANK_LABELS: collectors append their own labels
    (op, backend) after these, so a short list would silently shift them onto the wrong names."""
    if len(values) != len(RANK_LABELS):
        raise ValueError(f"rank label values {list(values)} must be one per {RANK_LABELS}")
    return [str(v) for v in values]


@dataclass(frozen=True)
class MetricDef:
    name: str
    type: str
    """gauge, counter or histogram (info metrics are gauges ending in ``_info`` with the value 1)."""
    unit: str
    """One of BASE_UNITS, or "" for counts, states and identifiers."""
    help: str
    labels: tuple[str, ...]
    """Labels in the order collectors give their values."""
    source: str
    """Where the value comes from, for the docs/reference/telemetry.md table."""


_DEV = "device source (npu-smi, rknpu, NVML, cpu)"

_ECC = "npu-smi info -t ecc; NVML ECC counters"
_HEALTH = "npu-smi info -t health -i N -c C"
_USAGES = "npu-smi info -t usages"
_NVML = "NVML (nvidia-ml-py)"


def _rel(name: str, type_: str, unit: str, help_: str, source: str, extra: tuple[str, ...] = ()) -> MetricDef:
    base = LINK_LABELS if name.startswith("npudist_link_") else DEVICE_LABELS
    return MetricDef(name, type_, unit, help_, (*base, *extra), source)


def _hccn(query: str) -> str:
    return f"hccn_tool -i N -{query} -g"


# Reliability and network families (sources/ascend_sweep.py, sources/nvml_reliability.py); each can be
# switched off by name or by its collector (`npudist exporter --collectors`).
RELIABILITY_ROWS: tuple[MetricDef, ...] = (
    _rel("npudist_device_ecc_corrected_errors_total", "counter", "",
         "Single-bit (corrected) ECC errors since the driver loaded or the GPU reset (NVML volatile).", _ECC,
         ("memory",)),
    _rel("npudist_device_ecc_uncorrected_errors_total", "counter", "",
         "Double-bit (uncorrectable) ECC errors since the driver loaded or the GPU reset (NVML volatile).", _ECC,
         ("memory",)),
    _rel("npudist_device_ecc_aggregate_corrected_errors_total", "counter", "",
         "Single-bit ECC errors over the device's lifetime (survives reboots; NVML aggregate).", _ECC, ("memory",)),
    _rel("npudist_device_ecc_aggregate_uncorrected_errors_total", "counter", "",
         "Double-bit ECC errors over the device's lifetime (survives reboots; NVML aggregate).", _ECC, ("memory",)),
    _rel("npudist_device_memory_retired_pages", "gauge", "",
         "Memory pages isolated (Ascend) or retired (NVIDIA) by cause: single_bit or double_bit.",
         "npu-smi info -t ecc; nvmlDeviceGetRetiredPages", ("memory", "cause")),
    _rel("npudist_device_memory_pending_retirement_pages", "gauge", "",
         "Pages to be isolated at the next reset (npu-smi Next-Isolated Pages), by cause.", _ECC,
         ("memory", "cause")),
    _rel("npudist_device_memory_retirement_pending", "gauge", "",
         "1 when NVIDIA page retirement waits for a GPU reset.", _NVML),
    _rel("npudist_device_memory_remapped_rows", "gauge", "",
         "Rows remapped (A100 and later) by cause: correctable or uncorrectable.", _NVML, ("cause",)),
    _rel("npudist_device_memory_remap_pending", "gauge", "", "1 when a row remap waits for a GPU reset.", _NVML),
    _rel("npudist_device_memory_remap_failed", "gauge", "",
         "1 when a row remap failed: the GPU needs service.", _NVML),
    _rel("npudist_device_xid_errors_total", "counter", "",
         "XID errors the driver reported since the exporter started, by XID code.", _NVML, ("xid",)),
    _rel("npudist_device_clock_throttle_active", "gauge", "",
         "1 while the clock is held down for this reason (NVML clocks event/throttle reasons).", _NVML,
         ("reason",)),
    _rel("npudist_device_alarm_level", "gauge", "",
         "Chip alarm level from npu-smi -t health: 0 OK, 1 Warning (minor), 2 Alarm (major), 3 Critical. "
         "The Health column of `npu-smi info` is the MCU's; chip alarms show only here.", _HEALTH),
    _rel("npudist_device_error_codes", "gauge", "", "Number of error codes the chip reports now.", _HEALTH),
    _rel("npudist_device_error_code_info", "gauge", "",
         "1 for each error code the chip reports now (hexadecimal, as npu-smi prints it).", _HEALTH, ("code",)),
    _rel("npudist_device_aivector_utilization_ratio", "gauge", "ratio", "AI vector unit busy fraction, 0-1.",
         _USAGES),
    _rel("npudist_device_aicube_utilization_ratio", "gauge", "ratio",
         "AI cube (matrix) unit busy fraction, 0-1, where the driver reports it.", _USAGES),
    _rel("npudist_device_aicpu_utilization_ratio", "gauge", "ratio", "AI CPU busy fraction, 0-1.", _USAGES),
    _rel("npudist_device_ctrlcpu_utilization_ratio", "gauge", "ratio", "Control CPU busy fraction, 0-1.", _USAGES),
    _rel("npudist_device_overall_utilization_ratio", "gauge", "ratio",
         "Whole-NPU busy fraction (npu-smi NPU Utilization), 0-1, where the driver reports it.", _USAGES),
    _rel("npudist_device_hbm_bandwidth_utilization_ratio", "gauge", "ratio",
         "Share of HBM bandwidth in use, 0-1.", _USAGES),
    _rel("npudist_device_ddr_bandwidth_utilization_ratio", "gauge", "ratio",
         "Share of DDR bandwidth in use, 0-1.", _USAGES),
    _rel("npudist_link_up", "gauge", "", "1 when the NIC's link is up, 0 when down.", _hccn("link")),
    _rel("npudist_link_up_events_total", "counter", "", "Link-up transitions since the driver loaded.",
         _hccn("link_stat")),
    _rel("npudist_link_down_events_total", "counter", "",
         "Link-down transitions since the driver loaded (newer drivers print it).", _hccn("link_stat")),
    _rel("npudist_link_speed_bytes_per_second", "gauge", "bytes_per_second",
         "Negotiated link speed (the tool prints bits/s; 100000 Mb/s = 1.25e10 bytes/s).", _hccn("speed")),
    _rel("npudist_link_net_healthy", "gauge", "",
         "1 when hccn_tool's network health check (a probe of the configured peer) says Success.",
         _hccn("net_health")),
    _rel("npudist_link_net_health_info", "gauge", "",
         "Always 1; the status label is the network health as printed (success, socket_fail, init, fault, ...).",
         _hccn("net_health"), ("status",)),
    _rel("npudist_link_info", "gauge", "", "Always 1; labels carry the NIC's IPv4 address and netmask.",
         _hccn("ip"), ("address", "netmask")),
    _rel("npudist_link_pause_frames_total", "counter", "", "MAC pause frames by direction.", _hccn("stat"),
         ("direction",)),
    _rel("npudist_link_pfc_frames_total", "counter", "",
         "PFC frames over all priorities by direction (a storm shows here first).", _hccn("stat"), ("direction",)),
    _rel("npudist_link_pfc_priority_frames_total", "counter", "", "PFC frames by direction and priority 0-7.",
         _hccn("stat"), ("direction", "priority")),
    _rel("npudist_link_mac_packets_total", "counter", "", "MAC packets by direction.", _hccn("stat"),
         ("direction",)),
    _rel("npudist_link_mac_bytes_total", "counter", "bytes", "MAC bytes by direction.", _hccn("stat"),
         ("direction",)),
    _rel("npudist_link_mac_bad_packets_total", "counter", "", "Bad MAC packets by direction.", _hccn("stat"),
         ("direction",)),
    _rel("npudist_link_mac_bad_bytes_total", "counter", "bytes", "Bytes of bad MAC packets by direction.",
         _hccn("stat"), ("direction",)),
    _rel("npudist_link_mac_fcs_errors_total", "counter", "", "Received frames with a bad FCS (checksum).",
         _hccn("stat")),
    _rel("npudist_link_roce_packets_total", "counter", "", "RoCE packets by direction.", _hccn("stat"),
         ("direction",)),
    _rel("npudist_link_roce_rc_packets_total", "counter", "", "RoCE reliable-connection packets by direction.",
         _hccn("stat"), ("direction",)),
    _rel("npudist_link_roce_error_packets_total", "counter", "", "Bad RoCE packets by direction.", _hccn("stat"),
         ("direction",)),
    _rel("npudist_link_roce_cnp_packets_total", "counter", "",
         "RoCE congestion notification packets (DCQCN) by direction.", _hccn("stat"), ("direction",)),
    _rel("npudist_link_roce_completions_total", "counter", "", "RoCE completion queue elements.", _hccn("stat")),
    _rel("npudist_link_roce_retransmits_total", "counter", "",
         "RoCE packets retransmitted (roce_new_pkt_rty_num): packet loss on the path.", _hccn("stat")),
    _rel("npudist_link_roce_ecn_marked_packets_total", "counter", "", "RoCE ECN-marked packets.", _hccn("stat")),
    _rel("npudist_link_roce_verification_errors_total", "counter", "", "RoCE packets failing verification.",
         _hccn("stat")),
    _rel("npudist_link_roce_unexpected_acks_total", "counter", "", "Unexpected RoCE ACKs.", _hccn("stat")),
    _rel("npudist_link_roce_out_of_order_packets_total", "counter", "",
         "RoCE packets out of order or repeated (PSN errors).", _hccn("stat")),
    _rel("npudist_link_roce_qp_status_errors_total", "counter", "", "RoCE packets for a queue pair in a bad state.",
         _hccn("stat")),
    _rel("npudist_link_nic_packets_total", "counter", "", "NIC packets by direction.", _hccn("stat"),
         ("direction",)),
    _rel("npudist_link_nic_bytes_total", "counter", "bytes", "NIC bytes by direction.", _hccn("stat"),
         ("direction",)),
    _rel("npudist_link_optical_present", "gauge", "", "1 when the tool reports the optical module present.",
         _hccn("optical")),
    _rel("npudist_link_optical_temperature_celsius", "gauge", "celsius", "Optical module temperature.",
         _hccn("optical")),
    _rel("npudist_link_optical_supply_voltage_volts", "gauge", "volts", "Optical module supply voltage (Vcc).",
         _hccn("optical")),
    _rel("npudist_link_optical_tx_power_watts", "gauge", "watts",
         "Transmit optical power per lane (the tool prints mW; dBm is converted).", _hccn("optical"), ("lane",)),
    _rel("npudist_link_optical_rx_power_watts", "gauge", "watts", "Receive optical power per lane.",
         _hccn("optical"), ("lane",)),
    _rel("npudist_link_optical_tx_bias_amperes", "gauge", "amperes", "Laser bias current per lane.",
         _hccn("optical"), ("lane",)),
    _rel("npudist_link_optical_media_snr_decibels", "gauge", "decibels", "Media-side signal-to-noise per lane.",
         _hccn("optical"), ("lane",)),
    _rel("npudist_link_optical_host_snr_decibels", "gauge", "decibels", "Host-side signal-to-noise per lane.",
         _hccn("optical"), ("lane",)),
    _rel("npudist_link_optical_signal_lost", "gauge", "", "1 when the lane reports loss of signal (LOS).",
         _hccn("optical"), ("direction", "lane")),
    _rel("npudist_link_optical_lock_lost", "gauge", "", "1 when the lane reports loss of lock (LOL).",
         _hccn("optical"), ("direction", "lane")),
    _rel("npudist_link_optical_temperature_limit_celsius", "gauge", "celsius",
         "The module's own temperature alarm limits (limit=high|low).", _hccn("optical"), ("limit",)),
    _rel("npudist_link_optical_supply_voltage_limit_volts", "gauge", "volts",
         "The module's own supply voltage alarm limits (limit=high|low).", _hccn("optical"), ("limit",)),
    _rel("npudist_link_optical_tx_power_limit_watts", "gauge", "watts",
         "The module's own transmit power alarm limits (limit=high|low).", _hccn("optical"), ("limit",)),
    _rel("npudist_link_optical_rx_power_limit_watts", "gauge", "watts",
         "The module's own receive power alarm limits (limit=high|low).", _hccn("optical"), ("limit",)),
)

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


# Suffixes that betray a non-base unit (milliseconds, percent, MiB, ...).
_BAD_SUFFIXES = ("_ms", "_milliseconds", "_us", "_percent", "_pct", "_mb", "_mib", "_kb", "_kib", "_gb",
                 "_mw", "_mhz", "_khz", "_millicelsius", "_count", "_sum", "_bucket")


def problems(rows: Iterable[MetricDef] = CATALOGUE) -> list[str]:
    """Every naming rule a row breaks, as readable lines (empty when the catalogue is sound)."""
    out: list[str] = []
    seen: set[str] = set()
    for m in rows:
        where = f"{m.name}:"
        if m.name in seen:
            out.append(f"{where} listed twice")
        seen.add(m.name)
        if not m.name.startswith("npudist_"):
            out.append(f"{where} missing the npudist_ prefix")
        if m.type not in TYPES:
            out.append(f"{where} type {m.type!r} is not one of {TYPES}")
        if m.unit and m.unit not in BASE_UNITS:
            out.append(f"{where} unit {m.unit!r} is not a base unit {BASE_UNITS}")
        stem = m.name.removesuffix("_total") if m.type == "counter" else m.name
        if m.type == "counter" and not m.name.endswith("_total"):
            out.append(f"{where} counters end in _total")
        if m.type != "counter" and m.name.endswith("_total"):
            out.append(f"{where} only counters end in _total")
        if m.unit and not stem.endswith("_" + m.unit):
            out.append(f"{where} name must end in its unit _{m.unit}")
        if not m.unit and any(stem.endswith("_" + u) for u in BASE_UNITS):
            out.append(f"{where} name ends in a unit but the row has none")
        if any(stem.endswith(s) for s in _BAD_SUFFIXES):
            out.append(f"{where} suffix names a non-base unit or a reserved series suffix")
        if m.name.endswith("_info") and m.type != "gauge":
            out.append(f"{where} info metrics are gauges")
        if len(set(m.labels)) != len(m.labels) or "le" in m.labels or "job" in m.labels:
            out.append(f"{where} labels repeat or use a reserved name (le, job)")
        if not m.help.strip():
            out.append(f"{where} has no help text")
    return out


def validate(rows: Iterable[MetricDef] = CATALOGUE) -> None:
    """Raise ValueError listing every broken naming rule."""
    found = problems(rows)
    if found:
        raise ValueError("metric catalogue is inconsistent:\n  " + "\n  ".join(found))


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
