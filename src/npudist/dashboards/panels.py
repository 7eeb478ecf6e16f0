"""The five npudist dashboards as data: panels, their queries and units; grafana.py renders the JSON.

Every query selects with ``$job`` and ``$node`` (Grafana variables), rank queries with ``$run`` too, and
uses only metrics from ``npudist.telemetry.exposition.catalogue`` or recording rules from ``rules.py``;
``npudist dashboards check`` and the tests enforce both. Units are Grafana unit ids (``watt``, ``bytes``,
``celsius``, ``percentunit``, ``s``, ``Bps``, ``hertz``, ``ops``): the metrics are in base units, so no
query rescales anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npudist.dashboards.rules import TOP_SLOW_RANKS
from npudist.telemetry.exposition.thresholds import SKEW_REFERENCE
from npudist.telemetry.exposition.thresholds import THRESHOLDS as _T

GRAFANA_UNITS = frozenset({"watt", "bytes", "celsius", "percentunit", "s", "Bps", "hertz", "ops", "short",
                           "none"})
PANEL_TYPES = frozenset({"timeseries", "stat", "table"})

SEL = 'job=~"$job", node=~"$node"'
"""Label matchers every device query carries."""
RANK_SEL = 'job=~"$job", run=~"$run", node=~"$node"'
_JOB_RUN = 'job=~"$job", run=~"$run"'
"""Label matchers every rank query carries: ``run`` tells two runs of one job apart (run_label.py)."""
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[Query, ...]
    type: str = "timeseries"
    description: str = ""
    """What the panel shows and what to do about it; every panel has one (tests/dashboards)."""
    width: int = 12
    """Grid columns out of 24 (grafana.py widens a row's last panel to fill the row)."""
    no_value: str = ""
    """What the panel shows when its query returns nothing (Grafana's ``noValue``); "" = Grafana's default."""
    thresholds: tuple[tuple[float, str], ...] | None = None
    """(value, colour) steps; None: derived by grafana.py from thresholds.py's THRESHOLDS and the
    temperature limits for the metrics the queries read."""
    bounds: tuple[float | None, float | None] | None = None
    """(min, max) of the axis; None: 0-1 for ratios (percentunit), else Grafana's automatic range."""


@dataclass(frozen=True)
class Variable:
    """A query variable: label values of ``label`` on ``metric``; multi-select with All."""
    name: str
    metric: str
    label: str


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    variables: tuple[Variable, ...] = field(default=())
    tags: tuple[str, ...] = ("npudist",)


def _q(expr: str, legend: str = "") -> Query:
    return Query(expr, legend)


def _dev(metric: str) -> str:
    return f"{metric}{{{SEL}}}"


_DEVICE_LEGEND = "{{node}} {{vendor}} {{device}}/{{chip}}"

# Reliability rows (issue 25): ECC, retired pages and chip alarms on Devices; link, RoCE, PFC and optics on
# Communication health. Link families come from the node exporter (its own job), so the Communication panels
# select them by node only; `npudist:device_rank:info` names the rank on each chip.
_NIC_LEGEND = "{{node}} NIC {{nic}} (device {{device}}/{{chip}})"
_NODE = 'node=~"$node"'
_WITH_RANK = " * on (node, device, chip) group_left (rank) npudist:device_rank:info"

DEVICE_RELIABILITY_PANELS: tuple[Panel, ...] = (
    Panel("ECC errors, uncorrectable (new in window)", "short", (
        _q(f"increase(npudist_device_ecc_uncorrected_errors_total{{{SEL}}}[{RATE}])", "{{memory}} " + _DEVICE_LEGEND),),
          description="Double-bit ECC errors the device could not correct, per memory (HBM, DDR; NVIDIA: device), "
                      "added in the panel's rate window. Any growth fires NpudistEccUncorrectable."),
    Panel("ECC errors, corrected (per second)", "ops", (
        _q(f"rate(npudist_device_ecc_corrected_errors_total{{{SEL}}}[{RATE}])", "{{memory}} " + _DEVICE_LEGEND),),
          description="Single-bit errors ECC corrected. A steady rise on one card predicts page isolation or "
                      "retirement."),
    Panel("Retired / isolated memory pages", "short", (
        _q(_dev("npudist_device_memory_retired_pages"), "{{cause}} " + _DEVICE_LEGEND),
        _q(_dev("npudist_device_memory_pending_retirement_pages"), "pending {{cause}} " + _DEVICE_LEGEND)),
          description="Pages the driver took out of service (Ascend isolated pages, NVIDIA retired pages) by "
                      "cause; pending ones go at the next reset."),
    Panel("Chip alarm level", "short", (_q(_dev("npudist_device_alarm_level"), _DEVICE_LEGEND),),
          description="From `npu-smi info -t health` per chip: 0 OK, 1 Warning, 2 Alarm (major), 3 Critical. "
                      "The Health column above is the card controller's and can say OK while a chip alarms."),
    Panel("Chip error codes", "none", (
        _q(f"max by (node, device, chip, code) (npudist_device_error_code_info{{{SEL}}}) "
           f"or on (node, device, chip) max by (node, device, chip) (npudist_device_error_codes{{{SEL}}})", ""),),
          type="table",
          description="Error codes each chip reports now (hexadecimal, as npu-smi prints them); chips without a "
                      "code show their count, 0."),
    Panel("AI vector / CPU / control CPU utilization", "percentunit", (
        _q(_dev("npudist_device_aivector_utilization_ratio"), "vector " + _DEVICE_LEGEND),
        _q(_dev("npudist_device_aicpu_utilization_ratio"), "AI CPU " + _DEVICE_LEGEND),
        _q(_dev("npudist_device_ctrlcpu_utilization_ratio"), "ctrl CPU " + _DEVICE_LEGEND)),
          description="The `npu-smi info -t usages` split beside AI-core utilization (top panel); cube and "
                      "whole-NPU utilization where the driver prints them."),
)

COMMUNICATION_RELIABILITY_PANELS: tuple[Panel, ...] = (
    Panel("Device links up", "short", (_q(f"npudist_link_up{{{_NODE}}}", _NIC_LEGEND),),
          description="hccn_tool `-link -g` per NPU NIC: 1 up, 0 down (NpudistLinkDown names the rank on it)."),
    Panel("Link flaps (link-ups in window)", "short", (
        _q(f"increase(npudist_link_up_events_total{{{_NODE}}}[{RATE}])", _NIC_LEGEND),),
          description="Link-up transitions from `-link_stat -g`; NpudistLinkFlapping fires at 3 in 15 minutes."),
    Panel("RoCE errors and retransmissions/s", "ops", (
        _q(f"sum without (direction) (rate(npudist_link_roce_error_packets_total{{{_NODE}}}[{RATE}]))",
           "errors " + _NIC_LEGEND),
        _q(f"rate(npudist_link_roce_retransmits_total{{{_NODE}}}[{RATE}]) or "
           f"rate(npudist_link_roce_qp_status_errors_total{{{_NODE}}}[{RATE}])", "retransmits " + _NIC_LEGEND)),
          description="Bad RoCE packets and retransmissions (roce_new_pkt_rty_num: packet loss on the path); "
                      "drivers that print no retransmit counter show queue-pair status errors instead."),
    Panel("PFC / pause frames/s", "ops", (
        _q(f"sum by (node, nic, device, chip, direction) "
           f"(rate(npudist_link_pfc_frames_total{{{_NODE}}}[{RATE}]))", "PFC {{direction}} " + _NIC_LEGEND),
        _q(f"sum by (node, nic, device, chip, direction) "
           f"(rate(npudist_link_pause_frames_total{{{_NODE}}}[{RATE}]))", "pause {{direction}} " + _NIC_LEGEND)),
          description="Priority flow control and MAC pause frames; NpudistPfcStorm fires above 1000/s for 5 "
                      "minutes. Next to the backlog: a paused link makes collectives pile up."),
    Panel("NIC throughput", "Bps", (
        _q(f"sum by (node, nic, device, chip, direction) (rate(npudist_link_nic_bytes_total{{{_NODE}}}[{RATE}]))",
           "{{direction}} " + _NIC_LEGEND),),
          description="Bytes per second through each NPU NIC (hccn_tool `-stat`), against the link speed."),
    Panel("Optical receive power vs the module's low limit", "watt", (
        _q(f"npudist_link_optical_rx_power_watts{{{_NODE}}}", "lane {{lane}} " + _NIC_LEGEND),
        _q(f'npudist_link_optical_rx_power_limit_watts{{{_NODE}, limit="low"}}', "low limit " + _NIC_LEGEND)),
          description="Per-lane receive power in watts (the tool prints mW) and the limit the module reports; "
                      "NpudistOpticalPowerOutOfRange fires outside the module's limits."),
    Panel("Network health and the rank on each NIC", "none", (
        _q(f"max by (node, nic, device, chip, status) (npudist_link_net_health_info{{{_NODE}}})"
           f"{_WITH_RANK} or on (node, device, chip) "
           f"max by (node, nic, device, chip, status) (npudist_link_net_health_info{{{_NODE}}})", ""),),
          type="table",
          description="hccn_tool `-net_health -g` (success, socket_fail, init, fault, ...) per NIC, with the "
                      "rank computing on its chip where a rank is located there."),
)

DEVICES = Dashboard(
    "npudist-devices", "npudist / Devices",
    "Per-device readings from `npudist exporter` for every vendor (npu-smi, rknpu, NVML, cpu).",
    (
        Panel("Utilization", "percentunit", (_q(_dev("npudist_device_utilization_ratio"), _DEVICE_LEGEND),),
              description="Share of time the device was busy, per device (0-1). Empty where the source does not "
                          "report it (the cpu source reports the host CPU)."),
        Panel("Power", "watt", (_q(_dev("npudist_device_power_watts"), _DEVICE_LEGEND),),
              description="Board power draw per device. Empty where the source reports no power (the cpu source; "
                          "rknpu boards without a power_usage node)."),
        Panel("Temperature", "celsius", (_q(_dev("npudist_device_temperature_celsius"), _DEVICE_LEGEND),),
              description="Device temperature; the colour turns red at the lowest vendor limit (limits.py) and "
                          "NpudistDeviceTooHot fires above each vendor's own limit for 2 minutes. Empty for the "
                          "cpu source."),
        Panel("Memory used / total", "bytes", (
            _q(_dev("npudist_device_memory_used_bytes"), "used " + _DEVICE_LEGEND),
            _q(_dev("npudist_device_memory_total_bytes"), "total " + _DEVICE_LEGEND)),
              description="Device (HBM/VRAM) memory in use against the total per device. Empty where the source has "
                          "no memory reading (rknpu boards without a memory_usage node)."),
        Panel("Frequency", "hertz", (_q(_dev("npudist_device_frequency_hertz"), _DEVICE_LEGEND),),
              description="Device clock; a drop under load means throttling. Empty where the source reports no clock "
                          "(npu-smi's table has none; the cpu source gives the host CPU's)."),
        Panel("Health", "none", (_q(f"max by (node, vendor, device, chip, model, health) "
                                    f"(npudist_device_info{{{SEL}}})", ""),), type="table",
              description="One row per device; the health column is what the vendor tool prints."),
        Panel("Device up", "none", (_q(_dev("npudist_device_up"), _DEVICE_LEGEND),),
              description="0 when the exporter's latest read failed or is stale."),
        Panel("Collector errors/s", "ops", (
            _q(f"sum by (job, instance, collector, reason) (rate(npudist_collector_errors_total{{job=~\"$job\"}}"
               f"[{RATE}]))", "{{instance}} {{collector}} {{reason}}"),),
              description="Failed device reads by reason (timeout, too_large, exit_code, parse, missing, error)."),
        *DEVICE_RELIABILITY_PANELS,
    ),
    (Variable("job", "npudist_device_up", "job"), Variable("node", "npudist_device_up", "node")),
)

_OP_LEGEND = "{{op}} ({{backend}})"

COMMUNICATION = Dashboard(
    "npudist-communication", "npudist / Communication health",
    "Collectives issued through npudist.comm: rate, latency, bandwidth, backlog and adaptations.",
    (
        Panel("Collective calls/s", "ops", (
            _q(f"sum by (op, backend) (rate(npudist_collective_calls_total{{{RANK_SEL}}}[{RATE}]))", _OP_LEGEND),),
              description="Collectives issued through npudist.comm per second, by operation and backend. "
                          "torch.distributed called directly is not counted."),
        Panel("Duration p50 / p99", "s", (
            _q(f"npudist:collective_duration_seconds:p50{{{RANK_SEL}}}", "p50 " + _OP_LEGEND),
            _q(f"npudist:collective_duration_seconds:p99{{{RANK_SEL}}}", "p99 " + _OP_LEGEND)),
              description="Median and 99th percentile latency of each collective (recording rules over 1 minute). A "
                          "growing p99 with a steady p50 points at one slow peer."),
        Panel("Payload bytes/s", "Bps", (_q(f"sum by (op, backend) (rate(npudist_collective_bytes_total{{{RANK_SEL}}}"
                                            f"[{RATE}]))", _OP_LEGEND),),
              description="Bytes handed to collectives per second (each rank's input tensor), by operation."),
        Panel("Bus bandwidth", "Bps", (_q(f"npudist:collective_busbw_bytes_per_second{{{_JOB_RUN}}}", _OP_LEGEND),),
              description="Bytes per second of collective time times the nccl-tests bus factor "
                          "(all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1)."),
        Panel("In-flight collectives (backlog)", "short", (
            _q(f"sum by (rank) (npudist_collective_inflight{{{RANK_SEL}}})", "rank {{rank}}"),),
              description=f"Async handles issued and not yet waited; alerts at > {_T['backlog'].text} "
                          f"({_T['backlog'].for_words}) and > {_T['backlog_critical'].text} "
                          f"({_T['backlog_critical'].for_words})."),
        Panel("Adaptations/s by kind", "ops", (
            _q(f"sum by (kind, op) (rate(npudist_collective_adaptations_total{{{RANK_SEL}}}[{RATE}]))",
               "{{kind}} {{op}}"),),
              description="Copies made so a backend accepts the tensor (cast, contiguous, pad, align, stage)."),
        *COMMUNICATION_RELIABILITY_PANELS,
    ),
    (Variable("job", "npudist_steps_total", "job"), Variable("node", "npudist_steps_total", "node"),
     Variable("run", "npudist_steps_total", "run")),
)

MEMORY = Dashboard(
    "npudist-memory", "npudist / Memory",
    "Device memory from the node exporter, and each rank's caching allocator.",
    (
        Panel("Device memory used vs total", "bytes", (
            _q("sum by (node) (npudist_device_memory_used_bytes{node=~\"$node\"})", "used {{node}}"),
            _q("sum by (node) (npudist_device_memory_total_bytes{node=~\"$node\"})", "total {{node}}")),
              description="Device memory per node from the node exporter; empty where the source has no memory "
                          "reading."),
        Panel("Allocator reserved vs allocated", "bytes", (
            _q(f"npudist_allocator_reserved_bytes{{{RANK_SEL}}}", "reserved rank {{rank}}"),
            _q(f"npudist_allocator_allocated_bytes{{{RANK_SEL}}}", "allocated rank {{rank}}")),
              description="Each rank's caching allocator: memory reserved from the device against memory holding "
                          "tensors. Empty on CPU (no allocator statistics)."),
        Panel("Fragmentation per rank", "percentunit", (
            _q(f"npudist_allocator_fragmentation_ratio{{{RANK_SEL}}}", "rank {{rank}}"),),
              description=f"1 - allocated/reserved; alerts above {_T['fragmentation'].value:g} for "
                          f"{_T['fragmentation'].for_words}."),
    ),
    (Variable("job", "npudist_steps_total", "job"), Variable("node", "npudist_steps_total", "node"),
     Variable("run", "npudist_steps_total", "run")),
)

OPERATORS = Dashboard(
    "npudist-operators", "npudist / Operators",
    "Self time per operator family from the profiled steps (one every op_every steps).",
    (
        Panel("p95 duration per operator", "s", (_q(f"npudist:op_duration_seconds:p95{{{_JOB_RUN}}}", "{{op}}"),),
              width=24,
              description="95th percentile self time per operator family over the profiled steps (5 minute window: "
                          "samples are sparse)."),
        Panel("Mean duration per operator and rank", "s", (
            _q(f"npudist:op_duration_seconds:mean{{{RANK_SEL}}}", "{{op}} rank {{rank}}"),),
              description=f"The matmul alert fires above {_T['matmul_seconds'].value * 1e6:g} us for "
                          f"{_T['matmul_seconds'].for_words}."),
        Panel("Profiled operator calls/s", "ops", (
            _q(f"sum by (op) (rate(npudist_op_duration_seconds_count{{{RANK_SEL}}}[{RATE}]))", "{{op}}"),),
              description="Operator calls seen per second in the profiled steps (one step every op_every is "
                          "profiled)."),
    ),
    (Variable("job", "npudist_steps_total", "job"), Variable("node", "npudist_steps_total", "node"),
     Variable("run", "npudist_steps_total", "run")),
)

# Rank metrics carry the device/chip the rank computes on (telemetry/exposition/rank_exporter.py): joined
# on them, a device series narrows to the straggler's own chip.
_STRAGGLER = 'npudist_steps_total{job=~"$job", run=~"$run", rank=~"$straggler"}'
_CHIP_LEGEND = "device {{device}} chip {{chip}} on {{node}}"

TRAINING = Dashboard(
    "npudist-training", "npudist / Training sync",
    "Step time per rank, cross-rank skew and the straggler, with its node's device temperature and clock.",
    (
        Panel("Step time per rank", "s", (_q(f"npudist:step_duration_seconds:mean{{{RANK_SEL}}}", "rank {{rank}}"),),
              description="Mean wall time of a training step per rank (1 minute). The slowest rank sets every rank's "
                          "pace in synchronous training."),
        Panel("Steps/s", "ops", (
            _q(f"sum by (rank) (rate(npudist_steps_total{{{RANK_SEL}}}[{RATE}]))", "rank {{rank}}"),),
              description="Training steps completed per second per rank; zero while the job is stalled."),
        Panel("Cross-rank skew", "percentunit", (_q(f"max by (job) (npudist_step_skew_ratio{{{_JOB_RUN}}})", "skew"),),
              description="stddev/mean of the ranks' work times per window. It dilutes as 1/sqrt(ranks) when one "
                          "rank is slow, so the straggler alert and diagnosis use the per-rank slowdown instead; "
                          f"the line is the seed's {SKEW_REFERENCE:g} rule, for reference.",
              thresholds=((SKEW_REFERENCE, "orange"),)),
        Panel("Slowest ranks (top 5 slowdown)", "none", (
            _q("topk(5, npudist_rank_slowdown_ratio{job=~\"$job\", run=~\"$run\"})",
               "rank {{rank}} device {{device}} chip {{chip}}"),),
              description="Each rank's work time over the median of the other ranks' (1 = typical). The straggler "
                          f"alert fires while the job's detector flags a rank for {_T['straggler'].for_words}."),
        Panel("Straggler rank", "none", (_q(f"max by (job) (npudist_straggler_rank{{{_JOB_RUN}}})", "rank"),),
              type="stat", width=6, no_value="none",
              description="The flagged rank with the largest slowdown; none while the detector flags no rank."),
        Panel("Where each step goes: phases over ranks (min / median / max)", "s", tuple(
            _q(f"npudist:rank_phase_seconds:per_step_{how}{{{_JOB_RUN}}}", f"{{{{phase}}}} {how}")
            for how in ("min", "median", "max")), width=12,
              description="Seconds per step in each phase (data, compute, comm_wait, comm_transfer, other), "
                          "over the job's ranks. A max far above the median in data, compute or other is one "
                          "slow rank; the others then show it as comm_wait (a wait above 0.2 of the step is "
                          "msprof's flag). Transfer is estimated as the least blocked rank's communication time."),
        Panel(f"Slow ranks (top {TOP_SLOW_RANKS} own time per step)", "s", (
            _q(f"npudist:rank_work_seconds:topk{{{_JOB_RUN}}}", "rank {{rank}} on {{node}}"),), width=12,
              description="The ranks with the most time of their own per step (data + compute + other): in "
                          "synchronous training the others wait for them. The job log names the phase "
                          "('phases: rank 1: data +41 ms per step')."),
        Panel("Straggler's node: hottest device", "celsius", (
            _q("npudist:node_device_temperature_celsius:max and on (node) "
               "npudist_steps_total{job=~\"$job\", run=~\"$run\", rank=~\"$straggler\"}", "{{node}}"),), width=9,
              description="Thermal throttling is the usual cause of one slow rank."),
        Panel("Straggler's node: slowest device clock", "hertz", (
            _q("npudist:node_device_frequency_hertz:min and on (node) "
               "npudist_steps_total{job=~\"$job\", run=~\"$run\", rank=~\"$straggler\"}", "{{node}}"),), width=9,
              description="The lowest device clock on the straggler's node; a clock below its peers' means "
                          "throttling."),
        Panel("Straggler's own device: temperature", "celsius", (
            _q(f"npudist_device_temperature_celsius and on (node, device, chip) {_STRAGGLER}", _CHIP_LEGEND),),
              width=12, description="The card and chip the straggler rank computes on: rank metrics carry its "
                                    "device/chip labels (npu-smi NPU ID and chip); empty where the device source "
                                    "cannot locate it (CPU)."),
        Panel("Training loss", "none", (_q(f"npudist_training_loss{{{RANK_SEL}}}", "rank {{rank}}"),),
              description="The loss the training loop last reported (telemetry.training_progress). Empty when "
                          "the loop does not call it."),
        Panel("Samples/s", "none", (
            _q(f"sum by (job) (npudist_training_samples_per_second{{{RANK_SEL}}})", "{{job}}"),),
              description="Throughput over the loop's logging window, summed over ranks that report it "
                          "(examples/train_ddp.py reports the global batch on rank 0 only)."),
        Panel("Checkpoint save: time blocking training", "s", (
            _q(f"rate(npudist_checkpoint_snapshot_duration_seconds_sum{{{RANK_SEL}}}[{RATE}])\n  / "
               f"rate(npudist_checkpoint_snapshot_duration_seconds_count{{{RANK_SEL}}}[{RATE}])", "rank {{rank}}"),),
              width=6, description="Mean time a checkpoint save held the training loop (the host copy for "
                                   "asynchronous saves). Empty between saves."),
        Panel("Checkpoint write time", "s", (
            _q(f"rate(npudist_checkpoint_write_duration_seconds_sum{{{RANK_SEL}}}[{RATE}])\n  / "
               f"rate(npudist_checkpoint_write_duration_seconds_count{{{RANK_SEL}}}[{RATE}])", "rank {{rank}}"),),
              width=6, description="Mean time to write, fsync, checksum and publish one checkpoint."),
        Panel("Checkpoint bytes/s", "Bps", (
            _q(f"rate(npudist_checkpoint_bytes_total{{{RANK_SEL}}}[{RATE}])", "rank {{rank}}"),), width=6,
              description="Checkpoint bytes published per second (rank 0 counts every rank's shards)."),
        Panel("Checkpoint failures", "short", (
            _q(f"increase(npudist_checkpoint_failures_total{{{RANK_SEL}}}[10m])", "rank {{rank}}"),), width=6,
              thresholds=((0, "green"), (1, "red")),
              description="Failed checkpoint writes in the last 10 minutes; NpudistCheckpointFailed fires on any. "
                          "Check disk space and the run directory's file system."),
        Panel("In-memory copy age", "short", (
            _q(f"npudist_peer_snapshot_age_steps{{{RANK_SEL}}}", "rank {{rank}}"),
            _q(f"2 * npudist_peer_snapshot_interval_steps{{{RANK_SEL}}}", "alert line, rank {{rank}}")), width=6,
              description="Steps since the newest copy of each rank's state its partner's node holds (npudist "
                          "launch --peer-snapshots K): a sawtooth up to K-1. NpudistNoFreshPeerSnapshot fires "
                          "once it stays above 2K, where a lost node would restart from disk. Empty with "
                          "peer snapshots off."),
        Panel("Restarts by source", "short", (
            _q(f"sum by (source) (increase(npudist_recoveries_total{{{RANK_SEL}}}[1h]))", "{{source}}"),), width=6,
              description="Resumes in the last hour by where the state came from: peer-memory (the partner "
                          "node's copy), local-memory (this node's) or disk. Disk while peer snapshots are on "
                          "means no in-memory copy survived."),
        Panel("Straggler's own device: utilization", "percentunit", (
            _q(f"npudist_device_utilization_ratio and on (node, device, chip) {_STRAGGLER}", _CHIP_LEGEND),),
              width=12,
              description="Utilization of the card and chip the straggler computes on; empty where the device source "
                          "cannot locate it (CPU)."),
    ),
    (Variable("job", "npudist_steps_total", "job"), Variable("node", "npudist_steps_total", "node"),
     Variable("run", "npudist_steps_total", "run"),
     Variable("straggler", "npudist_straggler_rank", "")),
)

DASHBOARDS: tuple[Dashboard, ...] = (DEVICES, COMMUNICATION, MEMORY, OPERATORS, TRAINING)


def all_queries(dashboards: tuple[Dashboard, ...] = DASHBOARDS) -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, expr) for every query of every panel."""
    return [(d.uid, p.title, q.expr) for d in dashboards for p in d.panels for q in p.queries]
