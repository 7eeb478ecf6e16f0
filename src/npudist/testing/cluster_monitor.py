"""A real Prometheus watching a namespace cluster: each node's ``npudist exporter`` and its ranks' metrics.

Each node runs ``npudist exporter`` on its own address (job ``npudist-node``, static targets) and its ranks
serve on ``NODE_ADDRESS:9500+local_rank``, listed by ``npudist launch --targets-file`` in a file_sd file of
the shared run directory (job ``npudist``), as `npudist deploy slurm` sets a real cluster up. Prometheus runs
in the root namespace, which reaches every node through the bridge, on 127.0.0.1, with npudist's own rules
(``npudist.dashboards.rules.ALERTS``, their ``for`` durations unchanged) so the alerts that fire are the ones
a user's Prometheus would fire; only the scrape and evaluation interval (default 2 s, against the usual
15-30 s) is shorter, so alerts fire up to that much sooner than on a default Prometheus.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from npudist.launch import free_port
from npudist.testing.cluster import TIMEOUT_S, Cluster, ClusterUnavailable, Node

EXPORTER_PORT = 9400
RANK_PORT = 9500


@dataclass(frozen=True)
class Fired:
    """An alert first seen firing ``after_s`` seconds after the monitor's mark."""

    name: str
    severity: str
    after_s: float
    where: str

    def __str__(self) -> str:
        return f"{self.name} ({self.severity}, {self.after_s:.0f} s{', ' + self.where if self.where else ''})"


class Monitor:
    """``with Monitor(cluster, run_dir) as m:`` then ``cluster.launch(..., launch_args=m.launch_args(node),
    env=m.env(node, env))``; ``m.mark()`` at the fault, ``m.poll()`` as often as wanted, ``m.fired``."""

    def __init__(self, cluster: Cluster, run_dir: str | Path, *, interval: str = "2s",
                 prometheus: str | None = None) -> None:
        self.cluster, self.dir = cluster, Path(run_dir) / "prometheus"
        self.interval = interval
        self.binary = prometheus or shutil.which("prometheus")
        if self.binary is None:
            raise ClusterUnavailable("needs the prometheus binary on PATH")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.fired: dict[str, Fired] = {}
        self._mark = time.monotonic()
        self._before: set[str] = set()

    def targets_file(self, node: Node) -> Path:
        return self.dir / "targets" / f"{node.hostname}.json"

    def launch_args(self, node: Node) -> list[str]:
        return ["--metrics-port", str(RANK_PORT), "--targets-file", str(self.targets_file(node))]

    @staticmethod
    def env(node: Node, env: Mapping[str, str]) -> dict[str, str]:
        """The ranks bind their metrics to the node's own address, as on a host with one NIC."""
        return {**env, "NPUDIST_METRICS_HOST": node.address}

    def __enter__(self) -> Monitor:
        from npudist.dashboards.rules import rules_document

        (self.dir / "targets").mkdir(parents=True, exist_ok=True)
        rules = self.dir / "rules.yml"
        rules.write_text(yaml.safe_dump(rules_document(), sort_keys=False))
        config = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval,
                       "scrape_timeout": self.interval},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": "npudist", "file_sd_configs": [
                    {"files": [str(self.dir / "targets" / "*.json")], "refresh_interval": "1s"}]},
                {"job_name": "npudist-node", "static_configs": [
                    {"targets": [f"{n.address}:{EXPORTER_PORT}" for n in self.cluster.nodes]}]},
            ],
        }
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        for n in self.cluster.nodes:
            self.cluster.spawn(n, [sys.executable, "-m", "npudist", "exporter", "--listen",
                                   f"{n.address}:{EXPORTER_PORT}", "--source", "cpu", "--interval", self.interval],
                               log=self.dir / f"exporter-{n.hostname}.log")
        with open(self.dir / "prometheus.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, f"--config.file={cfg}", f"--storage.tsdb.path={self.dir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise ClusterUnavailable(f"prometheus exited with {self.proc.returncode}: "
                                         f"see {self.dir / 'prometheus.log'}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise ClusterUnavailable(f"prometheus not ready at {self.url} within {timeout:.0f} s")

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=TIMEOUT_S) as r:
            return json.load(r)

    def up(self) -> dict[str, float]:
        """``instance -> up`` for every target scraped so far."""
        from urllib.parse import quote

        res = self._get("query?query=" + quote("up"))["data"]["result"]
        return {r["metric"]["instance"]: float(r["value"][1]) for r in res}

    def mark(self) -> None:
        """Time zero for ``Fired.after_s`` (the fault); alerts already firing then are not the fault's."""
        self.fired.clear()
        self.poll()
        self._before = set(self.fired)
        self.fired.clear()
        self._mark = time.monotonic()

    def poll(self) -> list[Fired]:
        """Record alerts firing now that were not seen before; returns the new ones."""
        try:
            alerts = self._get("alerts")["data"]["alerts"]
        except (OSError, ValueError, KeyError):
            return []
        new = []
        for a in alerts:
            name = a["labels"].get("alertname", "")
            if a.get("state") != "firing" or name in self.fired or name in self._before:
                continue
            where = a["labels"].get("instance") or a["labels"].get("node") or ""
            self.fired[name] = Fired(name, a["labels"].get("severity", ""), round(time.monotonic() - self._mark, 1),
                                     where)
            new.append(self.fired[name])
        return new

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=TIMEOUT_S)
