"""Grafana dashboards and Prometheus rules generated from the metric catalogue, and their checks."""

from npudist.dashboards.check import CheckResult, check_dir
from npudist.dashboards.export import ExportOptions, export, files
from npudist.dashboards.grafana import dashboard_json
from npudist.dashboards.panels import DASHBOARDS, Dashboard, Panel, Query, all_queries
from npudist.dashboards.rules import ALERTS, RECORDINGS, Alert, Recording, rules_document, with_for

__all__ = [
    "ALERTS", "DASHBOARDS", "RECORDINGS", "Alert", "CheckResult", "Dashboard", "ExportOptions", "Panel",
    "Query", "Recording", "all_queries", "check_dir", "dashboard_json", "export", "files", "rules_document",
    "with_for",
]
