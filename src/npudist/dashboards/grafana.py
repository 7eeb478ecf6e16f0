"""Dashboard data (panels.py) -> Grafana dashboard JSON (schema 39, Grafana 10/11).

Plain dicts rather than grafana-foundation-sdk: that package could not be installed from this project's
package index (see docs/dashboards.md); the JSON below follows Grafana's dashboard model
(https://grafana.com/docs/grafana/latest/dashboards/build-dashboards/view-dashboard-json-model/).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from npudist.dashboards.panels import Dashboard, Panel, Variable

SCHEMA_VERSION = 39
DATASOURCE = MappingProxyType({"type": "prometheus", "uid": "${datasource}"})
_HEIGHT = 8


def _variable(v: Variable) -> dict[str, Any]:
    if v.label:
        query = f"label_values({v.metric}, {v.label})"
        regex = ""
    else:  # the value of a gauge (the straggler's rank), not a label
        query = f'query_result(max({v.metric}{{job=~"$job"}}))'
        regex = r"/\} ([0-9]+) /"
    return {
        "name": v.name, "label": v.name, "type": "query", "datasource": dict(DATASOURCE),
        "query": {"query": query, "refId": f"{v.name}-var"}, "definition": query, "regex": regex,
        "refresh": 2, "includeAll": bool(v.label), "multi": bool(v.label), "allValue": ".*" if v.label else None,
        "current": {}, "options": [], "sort": 1, "hide": 0,
    }


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    targets = [{"refId": chr(ord("A") + i), "datasource": dict(DATASOURCE), "expr": q.expr,
                "legendFormat": q.legend or "__auto", "range": p.type != "table", "instant": p.type == "table"}
               for i, q in enumerate(p.queries)]
    out: dict[str, Any] = {
        "id": pid, "type": p.type, "title": p.title, "description": p.description, "datasource": dict(DATASOURCE),
        "gridPos": {"h": _HEIGHT, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "options": {}, "targets": targets,
    }
    if p.no_value:
        out["fieldConfig"]["defaults"]["noValue"] = p.no_value
    if p.type == "table":
        out["transformations"] = [{"id": "labelsToFields", "options": {}}]
    return out


def dashboard_json(d: Dashboard) -> dict[str, Any]:
    """The importable dashboard document (``uid`` fixed so re-imports replace, not duplicate)."""
    panels, x, y = [], 0, 0
    for i, p in enumerate(d.panels, start=1):
        if x + p.width > 24:
            x, y = 0, y + _HEIGHT
        panels.append(_panel(p, i, x, y))
        x += p.width
    variables = [{"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
                  "current": {}, "hide": 0, "refresh": 1, "options": []}]
    variables += [_variable(v) for v in d.variables]
    return {
        "uid": d.uid, "title": d.title, "description": d.description, "tags": list(d.tags),
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "graphTooltip": 1,
        "templating": {"list": variables}, "annotations": {"list": []}, "panels": panels,
    }
