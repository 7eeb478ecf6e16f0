"""Every panel query returns data and every alert expression evaluates, against a real Prometheus scraping
a real 2-rank training (one rank slowed) and real `npudist exporter` processes."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from npudist.dashboards import ALERTS, DASHBOARDS, RECORDINGS, rules_document, with_for
from npudist.dashboards.promql import substitute
from npudist.dashboards.rules import to_yaml
from tests.conftest import FAKES, REPO, child_env, fakes_path, free_port, free_ports
from tests.dashboards.prom import PROMETHEUS, Prometheus

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="Debian prometheus not installed")]
RANK_JOB = Path(__file__).with_name("rank_job.py")


def _exporter(port: int, source: str, extra: dict[str, str]) -> subprocess.Popen:
    env = child_env({"PATH": fakes_path(), **extra})
    return subprocess.Popen([sys.executable, "-m", "npudist", "exporter", "--listen", f"127.0.0.1:{port}",
                             "--source", source, "--interval", "1s"], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prom")
    procs: list[subprocess.Popen] = []
    prom = None
    try:
        ports = [free_port() for _ in range(3)]
        # A 910B node: its own `-t` outputs (910B usages print the vector split), and NIC 0's `-stat` from the
        # recording with RoCE error counters while NIC 1 prints the one with PFC/pause/NIC counters.
        t_dir, answers = tmp / "t", tmp / "hccn"
        t_dir.mkdir()
        answers.mkdir()
        for src in [*(FAKES / "npu-smi").glob("t-*-910b.txt"), *(FAKES / "npu-smi").glob("t-ecc-*.txt"),
                    FAKES / "npu-smi" / "t-health-ok.txt"]:
            (t_dir / src.name).write_text(src.read_text())
        (answers / "hccn_tool-stat-dev0.txt").write_text(
            (FAKES / "ascend-tools" / "hccn_tool-stat-mindcluster-1.txt").read_text())
        procs.append(_exporter(ports[0], "npu-smi", {
            "NPUDIST_FAKE_NPU_SMI_FILE": str(FAKES / "npu-smi" / "910b2c-8npu-constructed.txt"),
            "NPUDIST_FAKE_NPU_SMI_T_DIR": str(t_dir), "NPUDIST_FAKE_HCCN_DIR": str(answers)}))
        procs.append(_exporter(ports[1], "cpu", {}))  # the CPU's clock: npu-smi's table has no frequency
        procs.append(_exporter(ports[2], "npu-smi", {"NPUDIST_FAKE_NPU_SMI_MODE": "fail"}))  # a broken node
        base, targets, stop = free_ports(2), tmp / "sd" / "npudist.json", tmp / "stop"
        launch = subprocess.Popen(
            [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", "--metrics-port", str(base),
             "--targets-file", str(targets), "--peer-snapshots", "3", str(RANK_JOB), str(stop)],
            env=child_env({"PATH": fakes_path()}), cwd=REPO,
            stdout=(tmp / "launch.log").open("w"), stderr=subprocess.STDOUT)
        procs.append(launch)
        # Test copy of the rules: the straggler alert's `for` shortened from 5m so it goes pending here.
        rules = tmp / "rules.yml"
        rules.write_text(to_yaml(rules_document(with_for(ALERTS, NpudistStraggler="3s"), RECORDINGS)))
        end = time.monotonic() + 60
        while not targets.exists() and time.monotonic() < end:
            time.sleep(0.2)
        prom = Prometheus(tmp, rules, targets, [f"127.0.0.1:{p}" for p in ports])
        prom.wait_ready()
        yield prom
        stop.write_text("")
        launch.wait(timeout=60)
        assert launch.returncode == 0, (tmp / "launch.log").read_text()[-3000:]
    finally:
        for p in procs:
            _stop(p)
        if prom is not None:
            prom.stop()


def _series(prom: Prometheus, expr: str) -> list:
    res = prom.query(expr)
    assert res["status"] == "success", (expr, res)
    return res["data"]["result"]


def _wait_for(prom: Prometheus, expr: str, timeout: float) -> list:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = _series(prom, expr)
        if found:
            return found
        time.sleep(1)
    raise AssertionError(f"no series for {expr!r} within {timeout} s")


def test_straggler_alert_goes_pending_naming_rank_one(stack):
    found = _wait_for(stack, 'ALERTS{alertname="NpudistStraggler", alertstate=~"pending|firing"}', 90)
    assert (found[0]["metric"]["severity"], found[0]["metric"]["priority"]) == ("warning", "P2")
    # Rank 0's scrape of the named rank may lag rank 1's flag by a scrape interval: waited for, not raced.
    assert _wait_for(stack, "max(npudist_straggler_rank)", 30)[0]["value"][1] == "1"


def test_every_panel_query_returns_data(stack):
    # Slowest inputs first: operator histograms (profiled step every 5 steps) and rule-derived series.
    for expr in ("npudist:op_duration_seconds:p95", "npudist:collective_busbw_bytes_per_second",
                 "npudist:node_device_frequency_hertz:min", "npudist_collector_errors_total",
                 "npudist_straggler_rank", "npudist:device_rank:info", "npudist_link_up",
                 "npudist_link_optical_rx_power_watts", "npudist_device_alarm_level",
                 "npudist_peer_snapshot_age_steps"):
        _wait_for(stack, expr, 60)
    straggler = _series(stack, "max(npudist_straggler_rank)")[0]["value"][1]
    # launched with --peer-snapshots 3: each rank says so, and a healthy job's copies are fresh
    assert {s["value"][1] for s in _series(stack, "npudist_peer_snapshot_interval_steps")} == {"3"}
    assert _series(stack, next(a.expr for a in ALERTS if a.name == "NpudistNoFreshPeerSnapshot")) == []
    empty = []
    for d in DASHBOARDS:
        for p in d.panels:
            for q in p.queries:
                expr = substitute(q.expr, {"straggler": straggler, "__rate_interval": "30s"})
                if not _series(stack, expr):
                    empty.append(f"{d.title} / {p.title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_eight_devices_from_the_fake_npu_smi(stack):
    temps = _series(stack, 'npudist_device_temperature_celsius{vendor="npu"}')
    # 910b2c-8npu-constructed.txt: Temp(C) of NPUs 0-7, read from the file by hand
    by_device = {s["metric"]["device"]: float(s["value"][1]) for s in temps}
    assert by_device == {"0": 51, "1": 50, "2": 49, "3": 52, "4": 48, "5": 50, "6": 53, "7": 51}


def test_ranks_join_their_own_device(stack):
    _wait_for(stack, "npudist_steps_total", 60)
    where = {s["metric"]["rank"]: (s["metric"]["device"], s["metric"]["chip"])
             for s in _series(stack, "npudist_steps_total")}
    assert where == {"0": ("3", "0"), "1": ("4", "0")}  # info-m-mapping.txt: logical 0 is NPU 3, 1 is NPU 4
    (temp,) = _series(stack, 'npudist_device_temperature_celsius and on (node, device, chip) '
                             'npudist_steps_total{rank="1"}')
    assert (temp["metric"]["device"], float(temp["value"][1])) == ("4", 48.0)  # NPU 4's Temp(C) in the table


def test_every_alert_expression_evaluates(stack):
    for a in ALERTS:
        res = stack.query(a.expr)
        assert res["status"] == "success", (a.name, res)


def test_reliability_alerts_name_the_rank_on_the_card(stack):
    # The fake hccn_tool prints the recorded optical module of hccn_tool-optical-mindcluster-1.txt for every
    # NIC: lane 1 receives 0.0054 mW, below its 0.1445 mW limit. NIC 0 is logical chip 0 = NPU 3, rank 0's.
    _wait_for(stack, "npudist:device_rank:info", 60)
    (rx,) = [s for s in _series(stack, next(a.expr for a in ALERTS if a.name == "NpudistOpticalPowerOutOfRange"))
             if s["metric"]["nic"] == "0" and s["metric"]["direction"] == "rx"]
    assert (rx["metric"]["rank"], rx["metric"]["device"], rx["metric"]["lane"]) == ("0", "3", "1")


def test_a_finished_job_empties_its_targets_and_pages_no_one(tmp_path):
    """End to end: ranks scraped, a clean exit, then no target left and no alert pending or firing, with the
    down alerts' `for` cut to 1 s so one stale target would fire at once."""
    base, targets, stop = free_ports(2), tmp_path / "sd" / "npudist.json", tmp_path / "stop"
    rules = tmp_path / "rules.yml"
    rules.write_text(to_yaml(rules_document(with_for(ALERTS, NpudistExporterDown="1s", NpudistRankDown="1s"),
                                            RECORDINGS)))
    launch = subprocess.Popen(
        [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", "--metrics-port", str(base),
         "--targets-file", str(targets), str(RANK_JOB), str(stop)],
        env=child_env({"PATH": f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}"}), cwd=REPO,
        stdout=(tmp_path / "launch.log").open("w"), stderr=subprocess.STDOUT)
    prom = None
    try:
        end = time.monotonic() + 60
        while not targets.exists() and time.monotonic() < end:
            time.sleep(0.2)
        prom = Prometheus(tmp_path, rules, targets, [])
        prom.wait_ready()
        end = time.monotonic() + 90
        while len(_series(prom, 'up{job="npudist"} == 1')) < 2:
            assert time.monotonic() < end, "the two ranks were never scraped"
            time.sleep(1)
        stop.write_text("")
        launch.wait(timeout=90)
        assert launch.returncode == 0, (tmp_path / "launch.log").read_text()[-3000:]
        assert json.loads(targets.read_text()) == []
        # file_sd re-reads every 1 s, but Prometheus' discovery manager hands target changes to the scrape
        # manager at most every 5 s (discovery/manager.go updatert), later on a loaded host: wait for it.
        end = time.monotonic() + 60
        while _series(prom, 'up{job="npudist"}') and time.monotonic() < end:
            time.sleep(1)
        assert _series(prom, 'up{job="npudist"}') == []
        time.sleep(2)  # two more rule evaluations (every 1 s) with the targets gone
        assert _series(prom, "ALERTS") == []
    finally:
        _stop(launch)
        if prom is not None:
            prom.stop()
