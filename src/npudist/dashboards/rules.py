"""Prometheus alerting and recording rules as data, rendered to one rules file.

Thresholds come from thresholds.py's THRESHOLDS (backlog, straggler, fragmentation, matmul time; shared with the
job's own checks and the README) or from ``limits.py``. Each
alert carries two labels: ``severity`` in the kube-prometheus vocabulary that Alertmanager routes match on
(critical, warning, info; https://runbooks.prometheus-operator.dev/) and ``priority`` (P1 page now, P2 look
today, P3 look this week). Its annotations are a summary, a description naming the rank or device, and
``runbook_url``: an absolute link (Alertmanager and Grafana render it as one) to a section of docs/runbook.md
whose anchor is the alert name in lower case. Export with ``--runbook-url`` to point at your own copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import yaml

from npudist.dashboards.limits import over_limit_expr
from npudist.telemetry.exposition.thresholds import THRESHOLDS

RUNBOOK = "docs/runbook.md"
RUNBOOK_URL = "https://github.com/npudist/npudist/blob/main/docs/runbook.md"
"""Where ``runbook_url`` points unless the export names another copy (``--runbook-url``)."""
# RFC 3986 leaves these out of a URL; Prometheus expands every annotation as a Go text/template, so one
# `{{` in it makes each alert rule invalid (promtool: "template: __alert_...: unexpected ...").
_NOT_IN_URL = frozenset(' "<>\\^`{|}') | frozenset(map(chr, range(0x20))) | {chr(0x7F)}


def runbook_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the runbook_url annotation's base, or None when it can."""
    if not url.startswith(("https://", "http://", "file://")):
        return f"{url!r} must be absolute (https://...): Alertmanager and Grafana show it as a link"
    bad = sorted({c for c in url if c in _NOT_IN_URL})
    if bad:
        return (f"{url!r} holds {', '.join(map(repr, bad))}, which a URL cannot hold and Prometheus would read "
                "as a template: percent-encode them (e.g. { as %7B, space as %20)")
    return None


SEVERITY_LABELS = MappingProxyType({"P1": "critical", "P2": "warning", "P3": "info"})
SEVERITIES = tuple(SEVERITY_LABELS)
JOB_MATCH = 'job=~"npudist.*"'
"""Scrape jobs npudist's exporters run under: name them npudist* (e.g. npudist, npudist-node)."""
NODE_JOBS = 'job=~"npudist-(node|exporter).*"'
"""The node exporters' jobs: npudist-node (exported prometheus.yml, Slurm) and npudist-exporter (the k8s
ServiceMonitor takes the Service's name). Every other npudist* job scrapes training ranks."""
RANK_JOBS = f'{JOB_MATCH}, job!~"npudist-(node|exporter).*"'
WINDOW = "1m"


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    @property
    def anchor(self) -> str:
        return self.name.lower()


# nccl-tests' bus factors, applied to the bytes npudist.comm records (each rank's input tensor): all_gather's
# input is 1/n of the output nccl-tests counts, hence (n - 1) rather than (n - 1)/n
# (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
_W = "count by (job, run) (npudist_steps_total)"
BUS_FACTORS = MappingProxyType({
    "all_reduce": f"2 * ({_W} - 1) / {_W}",
    "all_gather": f"({_W} - 1)",
    "reduce_scatter": f"({_W} - 1) / {_W}",
    "broadcast": f"{_W} / {_W}",
})


def _busbw(op: str, factor: str) -> Recording:
    sel = f'{{op="{op}"}}'
    # `> 0` on the time spent: an op with no calls in the window has no series (0/0 would record NaN).
    algbw = (f"sum by (job, run, op, backend) (rate(npudist_collective_bytes_total{sel}[{WINDOW}]))\n"
             f"  / (sum by (job, run, op, backend) (rate(npudist_collective_duration_seconds_sum{sel}[{WINDOW}])) > 0)")
    # One rule per op under one name; the op label keeps them distinct (promtool's duplicate-rule lint).
    return Recording("npudist:collective_busbw_bytes_per_second",
                     f"({algbw})\n* on (job, run) group_left () ({factor})", (("op", op),))


def _quantile(q: str, metric: str, by: str, window: str) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[{window}])))"


def _mean(metric: str, by: str, window: str) -> str:
    return (f"sum by ({by}) (rate({metric}_sum[{window}]))\n"
            f"  / sum by ({by}) (rate({metric}_count[{window}]))")


_RANK = "job, run, node, rank"
# Operator samples are sparse (one profiled step every op_every steps): a longer window keeps data.
OP_WINDOW = "5m"
TOP_SLOW_RANKS = 3
"""The slow ranks a job's phase panel lists (npudist:rank_work_seconds:topk)."""
_PHASE_PER_STEP = "npudist:rank_phase_seconds:per_step"
_WORK_PHASES = 'phase=~"data|compute|other"'
"""A rank's own time: what the others wait for when it is long (diagnosis/straggler/phases.py)."""


def _phase_spread(how: str, aggregate: str) -> Recording:
    """The job's ``how`` over its ranks of each phase's seconds per step; ``aggregate`` opens the call."""
    return Recording(f"{_PHASE_PER_STEP}_{how}", f"{aggregate}{_PHASE_PER_STEP})")

RECORDINGS: tuple[Recording, ...] = (
    Recording("npudist:collective_duration_seconds:p50",
              _quantile("0.5", "npudist_collective_duration_seconds", "job, run, node, op, backend", WINDOW)),
    Recording("npudist:collective_duration_seconds:p99",
              _quantile("0.99", "npudist_collective_duration_seconds", "job, run, node, op, backend", WINDOW)),
    *(_busbw(op, f) for op, f in BUS_FACTORS.items()),
    Recording("npudist:op_duration_seconds:p95",
              _quantile("0.95", "npudist_op_duration_seconds", "job, run, op", OP_WINDOW)),
    Recording("npudist:op_duration_seconds:mean", _mean("npudist_op_duration_seconds", f"{_RANK}, op", OP_WINDOW)),
    Recording("npudist:step_duration_seconds:mean", _mean("npudist_step_duration_seconds", _RANK, WINDOW)),
    # Where each rank's step goes: seconds per step in each phase (the counters' rate over the steps' rate;
    # `> 0` keeps a rank that took no step in the window out instead of recording NaN), then the job's
    # spread per phase and the ranks with the most time of their own per step, the likely culprits.
    Recording(_PHASE_PER_STEP,
              f"sum by ({_RANK}, phase) (rate(npudist_rank_phase_seconds_total[{WINDOW}]))\n"
              f"  / on ({_RANK}) group_left ()\n"
              f"  (sum by ({_RANK}) (rate(npudist_steps_total[{WINDOW}])) > 0)"),
    _phase_spread("min", "min by (job, run, phase) ("),
    _phase_spread("median", "quantile by (job, run, phase) (0.5, "),
    _phase_spread("max", "max by (job, run, phase) ("),
    Recording("npudist:rank_work_seconds:topk",
              f"topk by (job, run) ({TOP_SLOW_RANKS},\n"
              f"  sum by ({_RANK}) ({_PHASE_PER_STEP}{{{_WORK_PHASES}}})\n)"),
    # Device exporters run under another job than the ranks: join them on node only.
    Recording("npudist:node_device_temperature_celsius:max", "max by (node) (npudist_device_temperature_celsius)"),
    Recording("npudist:node_device_frequency_hertz:min", "min by (node) (npudist_device_frequency_hertz)"),
    # Which rank computes on each chip: rank metrics carry the device/chip they run on
    # (telemetry/exposition/rank_exporter.py). One series per chip (topk), value 1, so a reliability alert
    # multiplied by it keeps its value and gains the `rank` label.
    Recording("npudist:device_rank:info",
              'topk by (node, device, chip) (1,\n  max by (node, device, chip, rank) '
              '(npudist_steps_total{device!=""}) * 0 + 1\n)'),
)

_RUN = "{{ if $labels.run }}, run {{ $labels.run }}{{ end }}"
"""The run label (telemetry/exposition/run_label.py) where the series carries one."""
_WHERE = f"rank {{{{ $labels.rank }}}} on {{{{ $labels.node }}}} (job {{{{ $labels.job }}}}{_RUN})"
_DEVICE = "device {{ $labels.device }} chip {{ $labels.chip }} ({{ $labels.model }}) on {{ $labels.node }}"

_T = THRESHOLDS
_BACKLOG_P1, _BACKLOG, _STRAGGLER, _FRAG, _MATMUL = (
    _T["backlog_critical"], _T["backlog"], _T["straggler"], _T["fragmentation"], _T["matmul_seconds"])
_RANK_DEVICE = "rank {{ $labels.rank }} (device {{ $labels.device }} chip {{ $labels.chip }}) on {{ $labels.node }}"

# Reliability and network alerts. Limits: a link that went up 3 times in 15 minutes flaps; a PFC storm is
# more than 1000 PFC frames/s for 5 minutes (a pause storm stalls the whole lossless class; MindCluster's
# fault guide and switch vendors treat a sustained pause flood as a fault); RoCE: more than 1 bad packet/s or
# 10 retransmits/s (roce_new_pkt_rty_num rising means packet loss: HCCL troubleshooting guide, "Switch
# Traffic Congestion, Backpressure, or Packet Loss and Retransmission"). Optical power is judged against
# the module's own alarm limits, which it reports.
FLAP_UPS, FLAP_WINDOW = 3, "15m"
PFC_STORM_FRAMES_PER_SECOND = 1000
ROCE_ERRORS_PER_SECOND, ROCE_RETRANSMITS_PER_SECOND = 1, 10
_CHIP = "node, device, chip"
_RANK_NAME = ("{{ if $labels.rank }}rank {{ $labels.rank }}{{ else }}no npudist rank (none located on this "
              "chip){{ end }}")
_CHIP_AT = "device {{ $labels.device }} chip {{ $labels.chip }} on {{ $labels.node }}"
_NIC = "NIC {{ $labels.nic }} of device {{ $labels.device }} chip {{ $labels.chip }} on {{ $labels.node }}"
_OPTICAL_LIMIT = "npudist_link_optical_{d}_power_watts {op} on (node, device, chip, nic, port) group_left ()\n" \
                 '  npudist_link_optical_{d}_power_limit_watts{{limit="{limit}"}}'


def with_rank(expr: str) -> str:
    """``expr`` with the ``rank`` label of the rank that computes on its chip (npudist:device_rank:info);
    series of chips no rank uses pass unchanged."""
    return (f"(\n  ({expr})\n  * on ({_CHIP}) group_left (rank) npudist:device_rank:info\n)\n"
            f"or on ({_CHIP})\n({expr})")


# label_replace adds `direction`: rx and tx lanes would otherwise collide once `*` drops the metric name.
_OPTICAL_OUT = "\nor ".join(
    f'label_replace(\n  ({_OPTICAL_LIMIT.format(d=d, op="<", limit="low")})\n  or '
    f'({_OPTICAL_LIMIT.format(d=d, op=">", limit="high")}),\n  "direction", "{d}", "", "")' for d in ("rx", "tx"))

RELIABILITY_ALERTS: tuple[Alert, ...] = (
    Alert("NpudistEccUncorrectable",
          with_rank("increase(npudist_device_ecc_uncorrected_errors_total[10m]) > 0"), "0m", "P1",
          "Uncorrectable (double-bit) ECC errors on a device in use",
          f"{_RANK_NAME} computes on {_CHIP_AT}, whose {{{{ $labels.memory }}}} memory had "
          "{{ $value | humanize }} new uncorrectable ECC errors in 10 minutes: results may be corrupt."),
    Alert("NpudistChipAlarm", with_rank("npudist_device_alarm_level >= 2"), "1m", "P1",
          "Chip alarm: major (Alarm) or critical",
          f"{_RANK_NAME} computes on {_CHIP_AT}, which reports alarm level {{{{ $value }}}} (2 major, 3 critical) "
          "in `npu-smi info -t health`; see its npudist_device_error_code_info codes."),
    Alert("NpudistLinkDown", with_rank("npudist_link_up == 0"), "1m", "P1", "Device network link down",
          f"{_RANK_NAME} uses {_NIC}, whose link is down: its collectives cannot reach peers."),
    Alert("NpudistLinkFlapping",
          # A difference, not increase(): increase() extrapolates, and a link-up count is small and exact.
          with_rank(f"npudist_link_up_events_total - npudist_link_up_events_total offset {FLAP_WINDOW} >= "
                    f"{FLAP_UPS}"), "0m", "P2",
          f"Device network link flapping ({FLAP_UPS}+ link-ups in {FLAP_WINDOW})",
          f"{_RANK_NAME} uses {_NIC}, which came up {{{{ $value | humanize }}}} times in {FLAP_WINDOW}: "
          "a loose cable, a failing optic or a switch port resetting."),
    Alert("NpudistPfcStorm",
          with_rank(f"sum without (direction) (rate(npudist_link_pfc_frames_total[5m])) > "
                    f"{PFC_STORM_FRAMES_PER_SECOND}"), "5m", "P2",
          f"PFC storm: more than {PFC_STORM_FRAMES_PER_SECOND} PFC frames/s for 5 minutes",
          f"{_RANK_NAME} uses {_NIC}, which sends and receives {{{{ $value | humanize }}}} PFC frames/s: "
          "the lossless class is paused, collectives crawl."),
    Alert("NpudistRoceErrors",
          with_rank(f"(sum without (direction) (rate(npudist_link_roce_error_packets_total[5m])) > "
                    f"{ROCE_ERRORS_PER_SECOND})\n  or (rate(npudist_link_roce_retransmits_total[5m]) > "
                    f"{ROCE_RETRANSMITS_PER_SECOND})"), "5m", "P2",
          "RoCE errors or retransmissions",
          f"{_RANK_NAME} uses {_NIC}: {{{{ $value | humanize }}}} bad or retransmitted RoCE packets/s "
          "(packet loss on the path)."),
    Alert("NpudistOpticalPowerOutOfRange", with_rank(_OPTICAL_OUT), "5m", "P2",
          "Optical power outside the module's own limits",
          f"{_RANK_NAME} uses {_NIC}: lane {{{{ $labels.lane }}}} is at {{{{ $value | humanize }}}}W, outside "
          "the limits its optical module reports (dirty or failing optic, bad fibre)."),
)


ALERTS: tuple[Alert, ...] = (
    Alert(_BACKLOG_P1.alert,
          f"sum by (job, run, node, rank) (npudist_collective_inflight) > {_BACKLOG_P1.value:g}", _BACKLOG_P1.for_,
          "P1",
          f"More than {_BACKLOG_P1.text} collectives in flight for {_BACKLOG_P1.for_words}",
          f"{_WHERE} has {{{{ $value }}}} async collectives issued and not completed: a peer is hung or the "
          "link is saturated."),
    Alert(_BACKLOG.alert,
          f"sum by (job, run, node, rank) (npudist_collective_inflight) > {_BACKLOG.value:g}", _BACKLOG.for_, "P2",
          f"More than {_BACKLOG.text} collectives in flight for {_BACKLOG.for_words}",
          f"{_WHERE} keeps {{{{ $value }}}} async collectives in flight: communication is falling behind compute."),
    # Every rank runs the same detector on the same exchanged rows and exports its own flag: one alert per
    # flagged rank, carrying its device labels, valued at its slowdown.
    Alert(_STRAGGLER.alert,
          "npudist_rank_slowdown_ratio\nand on (job, run, rank)\n"
          f"(npudist_rank_straggler > {_STRAGGLER.value:g})",
          _STRAGGLER.for_, "P2", f"One rank slows the whole job (flagged by the straggler detector for "
          f"{_STRAGGLER.for_words})",
          f"{_RANK_DEVICE} (job {{{{ $labels.job }}}}{_RUN}) works "
          f"{{{{ $value | printf \"%.2f\" }}}}x the median of the "
          "other ranks; every other rank waits for it at each collective. The job log and "
          "RUN_DIR/straggler-step*.json name the cause (compute, communication, data)."),
    Alert(_FRAG.alert,
          f"npudist_allocator_fragmentation_ratio > {_FRAG.value:g}", _FRAG.for_, "P3",
          f"Allocator fragmentation above {_FRAG.text} for {_FRAG.for_words}",
          f"{_WHERE}: {{{{ $value | humanizePercentage }}}} of the memory its allocator reserved holds no tensor."),
    Alert(_MATMUL.alert,
          f'npudist:op_duration_seconds:mean{{op="matmul"}} > {_MATMUL.value:g}', _MATMUL.for_, "P3",
          f"Mean matmul time above {_MATMUL.value * 1e6:g} us for {_MATMUL.for_words}",
          f"{_WHERE}: matmul takes {{{{ $value | humanizeDuration }}}} on average in the profiled steps."),
    Alert("NpudistDeviceUnhealthy",
          'npudist_device_info{health=~"Alarm|Critical"} == 1', "1m", "P1",
          "Device reports Alarm or Critical health",
          f"{_DEVICE} reports health {{{{ $labels.health }}}}."),
    Alert("NpudistDeviceWarning",
          'npudist_device_info{health=~"Warning|UNKNOWN"} == 1', "5m", "P2",
          "Device reports Warning or unknown health",
          f"{_DEVICE} reports health {{{{ $labels.health }}}}."),
    Alert("NpudistDeviceTooHot", over_limit_expr(), "2m", "P2",
          "Device above its vendor's temperature limit",
          f"{_DEVICE} is at {{{{ $value }}}} C, above the {{{{ $labels.vendor }}}} limit: it will throttle."),
    Alert("NpudistDeviceDown", "npudist_device_up == 0", "2m", "P2",
          "Exporter cannot read a device",
          f"The exporter's latest read of {_DEVICE} failed or is stale."),
    # Only node exporters: a rank's target goes down with the rank, and after a clean exit `npudist launch`
    # empties its targets file, so Prometheus stops scraping it instead of paging.
    Alert("NpudistExporterDown", f"up{{{NODE_JOBS}}} == 0", "2m", "P2",
          "Node exporter not scraped: device metrics missing",
          "Prometheus cannot scrape the node exporter {{ $labels.instance }} (job {{ $labels.job }}) "
          "for 2 minutes."),
    Alert("NpudistRankDown",
          f"up{{{RANK_JOBS}}} == 0\nand on (job) (max by (job) (up{{{RANK_JOBS}}}) == 1)", "1m", "P1",
          "A training rank stopped answering while the job's other ranks are up",
          "Prometheus cannot scrape the rank at {{ $labels.instance }} (job {{ $labels.job }}) while other "
          "ranks of the job answer: that rank died or hangs, and the others will wait for it at the next "
          "collective."),
    Alert("NpudistCollectorErrors",
          f"sum by (job, instance, collector, reason) (rate(npudist_collector_errors_total[{WINDOW}])) > 0",
          "5m", "P2", "A collector keeps failing",
          "Collector {{ $labels.collector }} on {{ $labels.instance }} fails with {{ $labels.reason }} "
          "for 5 minutes."),
    Alert("NpudistCheckpointFailed",
          "increase(npudist_checkpoint_failures_total[10m]) > 0", "0m", "P2",
          "A checkpoint write failed",
          f"{_WHERE} failed to write {{{{ $value }}}} checkpoint(s) in the last 10 minutes: a crash now would "
          "lose more work than planned."),
    # The age runs up to K-1 between snapshots and to 2K-1 when one is skipped (the previous copy was still
    # being sent): past 2K, copies stopped reaching the partner's node.
    Alert("NpudistNoFreshPeerSnapshot",
          "npudist_peer_snapshot_age_steps > 2 * npudist_peer_snapshot_interval_steps", "5m", "P2",
          "No fresh in-memory copy: a lost node would restart from disk",
          f"{_WHERE}: the newest copy of its state on its partner's node is {{{{ $value }}}} steps old; a node "
          "lost now restarts from the disk checkpoint, losing up to --checkpoint-every steps."),
    # A slow link does not make its ranks stragglers (a synchronous collective ends at once on every rank),
    # but every one of their store round trips crosses it. The reference is the job's faster quarter, so a
    # link behind half the ranks (2 nodes, the store on one) still stands out; the floor keeps jitter out.
    Alert("NpudistSlowNodeLink",
          "npudist_rank_store_rtt_seconds > 0.05\nand\nnpudist_rank_store_rtt_seconds\n"
          "  > on (job) group_left () (10 * quantile by (job) (0.25, npudist_rank_store_rtt_seconds))",
          "1m", "P2", "A node's network is slow: its ranks' round trips are 10x the job's fastest",
          f"{_WHERE}: round trips to the job's store take {{{{ $value | humanizeDuration }}}}, over 10 times "
          "those of the job's faster quarter of ranks: that node's link is slow or drops packets (or the host is "
          "overloaded), and every collective of the job waits for it."),
    # Only a fan-out front (npudist.infer.fanout) exports these two; their labels are the same rank's.
    Alert("NpudistEdgeEnsembleDegraded",
          "npudist_edge_members_answering < npudist_edge_members_expected", "1m", "P2",
          "The edge ensemble answers without some of its members",
          f"The fan-out front, {_WHERE}, has combined its answers from {{{{ $value }}}} members, fewer than the "
          "ensemble has, for a minute: a board is down, cut off or slower than the deadline. Answers go on, "
          "marked degraded, each naming the missing members."),
    Alert("NpudistTrainingStalled",
          f"increase(npudist_steps_total[{WINDOW}]) == 0\nand on (job, instance) (up{{{JOB_MATCH}}} == 1)", "5m", "P1",
          "Training stalled: no step for 5 minutes while the job is up",
          f"{_WHERE} finished no step in 5 minutes but its exporter answers: a hang (collective, data "
          "loader, I/O)."),
    *RELIABILITY_ALERTS,
)


def rules_document(alerts: tuple[Alert, ...] = ALERTS, recordings: tuple[Recording, ...] = RECORDINGS,
                   runbook_url: str = RUNBOOK_URL) -> dict[str, Any]:
    """The rules file as data: one recording group, one alert group; ValueError for an unusable runbook_url."""
    problem = runbook_url_problem(runbook_url)
    if problem is not None:
        raise ValueError(f"runbook_url {problem}")
    return {"groups": [
        {"name": "npudist.recording", "rules": [
            {"record": r.record, "expr": r.expr, **({"labels": dict(r.labels)} if r.labels else {})}
            for r in recordings]},
        {"name": "npudist.alerts", "rules": [
            {"alert": a.name, "expr": a.expr, "for": a.for_,
             "labels": {"severity": SEVERITY_LABELS[a.severity], "priority": a.severity},
             "annotations": {"summary": a.summary, "description": a.description,
                             "runbook_url": f"{runbook_url}#{a.anchor}"}}
            for a in alerts]},
    ]}


def with_for(alerts: tuple[Alert, ...], **durations: str) -> tuple[Alert, ...]:
    """A copy with some ``for`` durations replaced (tests: ``with_for(ALERTS, NpudistStraggler="5s")``)."""
    unknown = set(durations) - {a.name for a in alerts}
    if unknown:
        raise ValueError(f"no such alert(s): {', '.join(sorted(unknown))}")
    return tuple(dataclasses.replace(a, for_=durations.get(a.name, a.for_)) for a in alerts)


class _Literal(str):
    pass


def _literal(dumper: yaml.SafeDumper, s: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def to_yaml(doc: dict[str, Any]) -> str:
    """YAML with multi-line expressions as block scalars, so the file reads like a hand-written one."""
    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, str) and "\n" in x:
            return _Literal(x)
        return x
    return yaml.dump(walk(doc), Dumper=_Dumper, sort_keys=False, width=120)
