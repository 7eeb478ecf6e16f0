"""``npudist dashboards export``: every generated file as (relative path -> text), then written to a folder.

Layout (drop-in for docker compose or a Helm chart's config maps):
  grafana/<uid>.json                          dashboards
  prometheus/rules.yml                        alert and recording rules
  prometheus/prometheus.yml                   example server config: file_sd for `npudist launch --targets-file`
  provisioning/datasources/npudist.yml        Grafana datasource provider
  provisioning/dashboards/npudist.yml         Grafana dashboard provider (reads the grafana/ folder)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from npudist.dashboards.grafana import dashboard_json
from npudist.dashboards.panels import DASHBOARDS, Dashboard
from npudist.dashboards.rules import ALERTS, RECORDINGS, RUNBOOK_URL, Alert, Recording, rules_document, to_yaml


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    targets_file: str = "/etc/prometheus/sd/npudist.json"
    """The file `npudist launch --targets-file` writes (rank exporters)."""
    node_targets: tuple[str, ...] = ("127.0.0.1:9400",)
    """`npudist exporter` addresses (device metrics)."""
    scrape_interval: str = "15s"
    prometheus_url: str = "http://prometheus:9090"
    """How Grafana reaches Prometheus (the compose service name by default)."""
    dashboards_path: str = "/var/lib/grafana/dashboards/npudist"
    """Where the grafana/ folder is mounted in the Grafana container."""
    runbook_url: str = RUNBOOK_URL
    """Absolute URL of docs/runbook.md as your on-call reads it; alerts link to its sections."""


def prometheus_config(opts: ExportOptions) -> dict:
    return {
        "global": {"scrape_interval": opts.scrape_interval, "evaluation_interval": opts.scrape_interval},
        "rule_files": ["rules.yml"],
        "scrape_configs": [
            {"job_name": "npudist", "file_sd_configs": [{"files": [opts.targets_file], "refresh_interval": "30s"}]},
            {"job_name": "npudist-node", "static_configs": [{"targets": list(opts.node_targets)}]},
        ],
    }


def provisioning(opts: ExportOptions) -> dict[str, dict]:
    """Grafana's datasource and dashboard providers (https://grafana.com/docs/grafana/latest/administration/provisioning/)."""
    return {
        "provisioning/datasources/npudist.yml": {"apiVersion": 1, "datasources": [
            {"name": "Prometheus", "type": "prometheus", "access": "proxy", "url": opts.prometheus_url,
             "isDefault": True, "jsonData": {"timeInterval": opts.scrape_interval}}]},
        "provisioning/dashboards/npudist.yml": {"apiVersion": 1, "providers": [
            {"name": "npudist", "folder": "npudist", "type": "file", "disableDeletion": False,
             "allowUiUpdates": True, "options": {"path": opts.dashboards_path}}]},
    }


def files(opts: ExportOptions | None = None, dashboards: tuple[Dashboard, ...] = DASHBOARDS,
          alerts: tuple[Alert, ...] = ALERTS, recordings: tuple[Recording, ...] = RECORDINGS) -> dict[str, str]:
    """Every exported file's text by relative path (pure: no I/O)."""
    opts = opts or ExportOptions()
    out = {f"grafana/{d.uid}.json": json.dumps(dashboard_json(d), indent=2) + "\n" for d in dashboards}
    out["prometheus/rules.yml"] = to_yaml(rules_document(alerts, recordings, opts.runbook_url))
    out["prometheus/prometheus.yml"] = yaml.safe_dump(prometheus_config(opts), sort_keys=False)
    out.update({path: yaml.safe_dump(doc, sort_keys=False) for path, doc in provisioning(opts).items()})
    return out


def export(out_dir: Path, opts: ExportOptions | None = None, **kw) -> list[Path]:
    """Write ``files()`` under ``out_dir`` (created; existing files replaced); return the paths written."""
    written = []
    for rel, text in files(opts, **kw).items():
        path = Path(out_dir) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
