"""`npudist observe`: a real Prometheus on the job's targets file with npudist's rules, its URL printed."""

import json
import sys
from pathlib import Path

import pytest
import yaml

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
