"""Alert rules as a PrometheusRule and dashboards as ConfigMaps, from what `npudist dashboards export` writes.

Both are taken from ``dashboards.export.files()``, so a cluster gets the very rules promtool checks and
the very JSON the dashboards tests query.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import yaml

from npudist.dashboards.export import files as dashboard_files
from npudist.deploy.manifest import meta, render
from npudist.deploy.options import K8sOptions

GRAFANA_LABEL = MappingProxyType({"grafana_dashboard": "1"})
"""What the Grafana Helm chart's dashboard sidecar looks for (its default sidecar.dashboards.label/labelValue)."""
RULES = "prometheus/rules.yml"


def _labels(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {"app.kubernetes.io/name": "npudist", "app.kubernetes.io/part-of": "npudist", **(extra or {})}


def prometheus_rule(opts: K8sOptions, exported: dict[str, str]) -> dict[str, Any]:
    groups = yaml.safe_load(exported[RULES])["groups"]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": meta("npudist-rules", opts, _labels(opts.monitor_label_map)),
            "spec": {"groups": groups}}


def dashboard_configmaps(opts: K8sOptions, exported: dict[str, str]) -> dict[str, dict[str, Any]]:
    """uid -> ConfigMap holding ``grafana/<uid>.json`` byte for byte."""
    out = {}
    for path, text in exported.items():
        if path.startswith("grafana/") and path.endswith(".json"):
            uid = path.removeprefix("grafana/").removesuffix(".json")
            out[uid] = {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": meta(f"{uid}-dashboard", opts, _labels(GRAFANA_LABEL)),
                        "data": {f"{uid}.json": text}}
    return out


def files(opts: K8sOptions) -> dict[str, str]:
    exported = dashboard_files()
    out = {"prometheusrule.yaml": render(
        prometheus_rule(opts, exported),
        "npudist's alert and recording rules (the groups of `npudist dashboards export`'s rules.yml).")}
    for uid, cm in dashboard_configmaps(opts, exported).items():
        out[f"dashboard-{uid}.yaml"] = render(
            cm, f"Grafana dashboard {uid}, loaded by the Grafana sidecar (label grafana_dashboard=1).")
    return out
