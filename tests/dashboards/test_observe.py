"""`npudist observe`: a real Prometheus on the job's targets file with npudist's rules, its URL printed."""

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from npudist.dashboards.observe import ObserveError, wait_ready
from tests.conftest import run_npudist
from tests.dashboards.prom import PROMETHEUS, free_port

PROBE = """
import json, sys, urllib.request
url = sys.argv[1]
rules = json.load(urllib.request.urlopen(url + "/api/v1/rules", timeout=10))
names = [r["name"] for g in rules["data"]["groups"] for r in g["rules"] if r["type"] == "alerting"]
open(sys.argv[2], "w").write(json.dumps(names))
"""


@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="Debian prometheus not installed")
def test_observe_runs_prometheus_on_the_targets_file_while_the_job_runs(tmp_path):
    port, seen = free_port(), tmp_path / "seen.json"
    (tmp_path / "probe.py").write_text(PROBE)
    res = run_npudist(["observe", "--targets-file", str(tmp_path / "targets.json"), "--port", str(port),
                       "--out", str(tmp_path / "obs"), "--", sys.executable, str(tmp_path / "probe.py"),
                       f"http://127.0.0.1:{port}", str(seen)], timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"Prometheus at http://127.0.0.1:{port}" in res.stdout
    assert "docker run" in res.stdout  # how to add Grafana: Debian has no grafana package
    assert "NpudistRankDown" in json.loads(seen.read_text())  # the rules were loaded while the job ran
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
