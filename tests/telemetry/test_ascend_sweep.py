"""The Ascend reliability sweep and its families, end to end through the fake npu-smi and hccn_tool: what a
node serves when the tools answer, hang, fail or print garbage, and what --collectors switches off."""

from __future__ import annotations

import time

import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from npudist.telemetry.exposition.catalogue import RELIABILITY_ROWS
from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.node_exporter import ExporterError, build, collectors, selection_from
from npudist.telemetry.exposition.reliability_metrics import ReliabilityCollector
from npudist.telemetry.exposition.selection import parse_selection
from npudist.telemetry.sources.ascend_sweep import HCCN_QUERIES, NPU_SMI_QUERIES, AscendSweep, ascend_sweeps
from npudist.telemetry.sources.measurements import ChipMeasurements
from npudist.telemetry.sources.poller import Poller


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:  # it exited meanwhile
        return ""


def _serve(sweeps: list[AscendSweep], health: CollectorHealth, spec: str = "all") -> tuple[CollectorRegistry, list]:
    pollers = [Poller(s, health, interval_s=60, timeout_s=30, record=ChipMeasurements) for s in sweeps]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReliabilityCollector(pollers, health, parse_selection(spec, collectors()), node="n1"))
    registry.register(health)
    return registry, pollers


def _samples(registry: CollectorRegistry) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _one(samples: dict[tuple, float], name: str, **labels: str) -> float:
    hits = [v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


@pytest.mark.subprocess
def test_sweep_serves_every_ascend_family_from_the_fakes(ascend_path):
    health = CollectorHealth()
    registry, pollers = _serve(ascend_sweeps(health, lambda q: True, timeout=20), health)
    for p in pollers:
        assert p.poll_once()
    got = _samples(registry)
    # info-m-mapping.txt: NPU 3 chip 0 is logical 0 (hccn_tool -i 0), NPU 4 chip 0 logical 1.
    assert _one(got, "npudist_link_up", device="3", chip="0", nic="0", node="n1") == 1
    assert _one(got, "npudist_link_optical_tx_power_watts", device="4", nic="1", lane="0") == pytest.approx(4.4035e-3)
    assert _one(got, "npudist_link_nic_bytes_total", device="3", direction="rx") == 482237805
    assert _one(got, "npudist_link_info", device="3") == 1
    assert _one(got, "npudist_device_alarm_level", device="4", chip="0") == 0
    assert _one(got, "npudist_device_ecc_uncorrected_errors_total", device="3", memory="hbm") == 0
    served = {n.removesuffix("_total") for n, _ in got}
    ascend = {r.name.removesuffix("_total") for r in RELIABILITY_ROWS if not r.source.startswith("NVML")}
    # Not in any recording: per-priority PFC, cube/overall split and next-isolated pages (950/newer drivers),
    # error codes of a healthy chip, host SNR ("not supported"), the elided stat counters.
    assert len(served & ascend) >= 30, sorted(ascend - served)


@pytest.mark.subprocess
def test_hung_hccn_tool_is_killed_counted_and_skipped_and_scrapes_stay_fast(ascend_path, monkeypatch):
    monkeypatch.setenv("NPUDIST_FAKE_HCCN_MODE", "hang")
    monkeypatch.setenv("NPUDIST_FAKE_HCCN_HANG_S", "30")
    health = CollectorHealth()
    (sweep,) = ascend_sweeps(health, lambda q: q.tool == "hccn_tool", timeout=1.0)
    registry, (poller,) = _serve([sweep], health)
    began = time.monotonic()
    poller.poll_once()
    assert time.monotonic() - began < 15  # one timeout, not one per chip and query
    leftover = [c for c in psutil.Process().children(recursive=True) if "hccn_tool" in _cmdline(c)]
    assert leftover == []  # the hung call was killed with its process group, not left sleeping
    errors = health.errors("hccn_tool:link")
    assert errors == {"timeout": 1, "skipped": 1}  # chip 1's link call skipped after chip 0's timed out
    assert health.errors("hccn_tool:optical") == {"skipped": 2}
    began = time.monotonic()
    got = _samples(registry)
    assert time.monotonic() - began < 1.0
    assert _one(got, "npudist_collector_errors_total", collector="hccn_tool:link", reason="timeout") == 1
    assert not any(n == "npudist_link_up" for n, _ in got)


@pytest.mark.subprocess
@pytest.mark.parametrize("mode, reason", [("fail", "exit_code"), ("garbage", "parse")])
def test_failing_or_garbage_hccn_tool_is_counted_per_query(ascend_path, monkeypatch, mode, reason):
    monkeypatch.setenv("NPUDIST_FAKE_HCCN_MODE", mode)
    health = CollectorHealth()
    (sweep,) = ascend_sweeps(health, lambda q: q.tool == "hccn_tool", timeout=20)
    registry, (poller,) = _serve([sweep], health)
    assert poller.poll_once()  # the sweep itself succeeds: npu-smi still lists the chips
    for q in HCCN_QUERIES:
        assert health.errors(f"hccn_tool:{q.name}") == {reason: 2}
    assert not any(n.startswith("npudist_link_") for n, _ in _samples(registry))


@pytest.mark.subprocess
def test_last_good_answer_is_served_then_dropped_when_stale(ascend_path, monkeypatch):
    now = [0.0]
    sweep = AscendSweep([q for q in HCCN_QUERIES if q.name == "link"], CollectorHealth(), name="hccn_tool",
                        timeout=20, stale_after_s=60, clock=lambda: now[0])
    assert len(sweep.read()) == 2
    monkeypatch.setenv("NPUDIST_FAKE_HCCN_MODE", "fail")
    now[0] = 59.0
    assert [c.measurements[0].value for c in sweep.read()] == [1.0, 1.0]  # last good, still young
    now[0] = 61.0
    assert sweep.read() == []  # an old link state is not reported as the current one


@pytest.mark.subprocess
def test_down_link_is_reported_for_its_own_nic(ascend_path, monkeypatch):
    monkeypatch.setenv("NPUDIST_FAKE_HCCN_DOWN", "1")
    health = CollectorHealth()
    sweep = AscendSweep([q for q in HCCN_QUERIES if q.name == "link"], health, name="hccn_tool", timeout=20)
    assert {(c.device_id, c.nic): c.measurements[0].value for c in sweep.read()} == {(3, "0"): 1.0, (4, "1"): 0.0}


@pytest.mark.subprocess
def test_collectors_switch_queries_and_families_off(ascend_path, monkeypatch):
    log = ascend_path / "hccn.log"
    monkeypatch.setenv("NPUDIST_FAKE_HCCN_ARGS", str(log))
    selection = parse_selection("all,-optical,-stat,-ip,-speed,-link_stat,-npudist_link_net_health_info",
                                collectors())
    health = CollectorHealth()
    sweeps = ascend_sweeps(health, lambda q: selection.any_on(q.families), timeout=20)
    assert [[q.name for q in s.queries] for s in sweeps] == [["ecc", "health", "usages"], ["link", "net_health"]]
    pollers = [Poller(s, health, interval_s=60, record=ChipMeasurements) for s in sweeps]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReliabilityCollector(pollers, health, selection, node="n1"))
    for p in pollers:
        p.timeout_s = 30
        p.poll_once()
    names = {n for n, _ in _samples(registry)}
    assert "npudist_link_net_healthy" in names and "npudist_link_net_health_info" not in names
    assert not any("optical" in n for n in names)
    assert "-optical" not in log.read_text()  # a switched-off query is never run


def test_selection_spellings_and_errors(tmp_path):
    every = collectors()
    assert parse_selection("link,optical", every).families == frozenset(every["link"] + every["optical"])
    assert parse_selection("none,npudist_link_up", every).families == {"npudist_link_up"}
    assert len(parse_selection("", every).families) == len({f for fams in every.values() for f in fams})
    with pytest.raises(ExporterError, match="neither a collector"):
        selection_from("all,-opticals", None)
    counters = tmp_path / "counters.txt"
    counters.write_text("# our site\nnone\necc   # only ECC\nhealth\n")
    assert selection_from(None, str(counters)).families == frozenset(every["ecc"] + every["health"])
    with pytest.raises(ExporterError, match="cannot read"):
        selection_from(None, str(tmp_path / "missing.txt"))


def test_every_query_family_is_in_the_catalogue_and_every_ascend_row_has_a_query():
    names = {r.name for r in RELIABILITY_ROWS}
    by_query = {f for q in NPU_SMI_QUERIES + HCCN_QUERIES for f in q.families}
    assert by_query <= names
    assert {r.name for r in RELIABILITY_ROWS if not r.source.startswith("NVML")} == by_query


def test_build_without_sweeps_serves_no_reliability_family():
    exporter = build([], 5.0, node="n1")
    assert not any(n.startswith("npudist_link_") for n, _ in _samples(exporter.registry))
