"""A real Prometheus (Debian's /usr/bin/prometheus) on 127.0.0.1 for tests, and its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from tests.conftest import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class Prometheus:
    def __init__(self, tmp: Path, rules_file: Path, targets_file: Path, node_targets: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(rules_file)],
            "scrape_configs": [
                {"job_name": "npudist", "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}]},
                {"job_name": "npudist-node", "static_configs": [{"targets": node_targets}]},
            ],
        }
        cfg = tmp / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config))
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 30) -> None:
        from npudist.dashboards.observe import wait_ready

        wait_ready(self.url, self.proc, timeout)

    def api(self, path: str, **params: str) -> dict:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as exc:  # 400 on a bad query: the body says why
            return json.load(exc)

    def query(self, expr: str) -> dict:
        return self.api("query", query=expr)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.log.close()
