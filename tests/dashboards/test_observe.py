"""`npudist observe`: a real Prometheus on the job's targets file with npudist's rules, its URL printed."""

import http.server
import json
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from npudist.dashboards.observe import ObserveError, wait_ready
from tests.conftest import child_env, free_port, run_npudist
from tests.dashboards.prom import PROMETHEUS

pytestmark = pytest.mark.subprocess

PROBE = """
import json, sys, time, urllib.parse, urllib.request
url = sys.argv[1]
rules = json.load(urllib.request.urlopen(url + "/api/v1/rules", timeout=10))
names = [r["name"] for g in rules["data"]["groups"] for r in g["rules"] if r["type"] == "alerting"]
devices, end = [], time.monotonic() + 90
while not devices and time.monotonic() < end:  # the host's exporter, scraped every 5 s
    q = urllib.parse.quote("npudist_device_up")
    devices = json.load(urllib.request.urlopen(url + "/api/v1/query?query=" + q, timeout=10))["data"]["result"]
    time.sleep(1)
open(sys.argv[2], "w").write(json.dumps({"alerts": names, "devices": [d["metric"] for d in devices]}))
"""


@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="Debian prometheus not installed")
def test_observe_runs_prometheus_and_the_hosts_exporter_and_keeps_answering_after_the_job(tmp_path):
    port, seen = free_port(), tmp_path / "seen.json"
    (tmp_path / "probe.py").write_text(PROBE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "npudist", "observe", "--targets-file", str(tmp_path / "targets.json"), "--port",
         str(port), "--exporter-port", str(free_port()), "--out", str(tmp_path / "obs"), "--keep-after", "--",
         sys.executable, str(tmp_path / "probe.py"), f"http://127.0.0.1:{port}", str(seen)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "the job ended" in line:
                break
        # The job is over and Prometheus still answers with its data, until Ctrl-C.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=10) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    out = "".join(lines) + rest
    assert proc.returncode == 0, out
    assert f"Prometheus at http://127.0.0.1:{port}" in out and "docker run" in out  # Debian has no grafana
    assert "stopped; data kept in" in out and "exited with" not in out
    got = json.loads(seen.read_text())
    assert "NpudistRankDown" in got["alerts"]  # the rules were loaded while the job ran
    assert got["devices"] and {d["vendor"] for d in got["devices"]} <= {"cpu", "npu", "cuda", "mlu", "rknpu"}
    config = yaml.safe_load((tmp_path / "obs" / "prometheus" / "prometheus.yml").read_text())
    assert config["scrape_configs"][0]["file_sd_configs"][0]["files"] == [str((tmp_path / "targets.json").resolve())]


def test_observe_without_prometheus_is_a_usage_error(tmp_path):
    res = run_npudist(["observe", "--prometheus", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert res.returncode == 2 and "apt-get install prometheus" in " ".join(res.stderr.split())


class _Ready(http.server.BaseHTTPRequestHandler):
    """Another process on the port, answering /-/ready as any Prometheus would."""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"status":"success","data":{"storage.tsdb.path":"/elsewhere"}}')

    def log_message(self, *args):
        pass


@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="Debian prometheus not installed")
def test_observe_on_a_taken_port_refuses_instead_of_pointing_at_the_other_process(tmp_path):
    """Third audit: Prometheus exits on the taken port, but the other process's /-/ready answered for it."""
    other = http.server.HTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        port, ran = other.server_address[1], tmp_path / "ran"
        res = run_npudist(["observe", "--targets-file", str(tmp_path / "targets.json"), "--port", str(port),
                           "--out", str(tmp_path / "obs"), "--", sys.executable, "-c",
                           f"open({str(ran)!r}, 'w')"], timeout=120)
    finally:
        other.shutdown()
        other.server_close()
    text = " ".join(res.stderr.split())
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in text and "--port" in text
    assert "Prometheus at" not in res.stdout and not ran.exists()  # no success line, the job not started


def test_wait_ready_refuses_a_prometheus_that_is_not_ours(tmp_path):
    other = http.server.HTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(ObserveError, match="already in use"):
            wait_ready(f"http://127.0.0.1:{other.server_address[1]}", proc, 10, tmp_path / "tsdb")
    finally:
        proc.kill()
        proc.wait()
        other.shutdown()
        other.server_close()
