"""Dashboard data (panels.py) -> Grafana dashboard JSON (schema 39, Grafana 10/11).

Plain dicts rather than grafana-foundation-sdk: that package could not be installed from this project's
package index (see docs/guide/observing.md); the JSON below follows Grafana's dashboard model
(https://grafana.com/docs/grafana/latest/dashboards/build-dashboards/view-dashboard-json-model/).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from npudist.dashboards.limits import LIMITS
from npudist.dashboards.panels import Dashboard, Panel, Variable
from npudist.telemetry.exposition.thresholds import THRESHOLDS

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


# Metric (or recording rule) -> (value, colour) steps coloured on any panel that reads it: the catalogue's
# alert thresholds, and for temperatures the lowest vendor limit (limits.py).
def _threshold_steps() -> Mapping[str, tuple[tuple[float, str], ...]]:
    steps: dict[str, list[tuple[float, str]]] = {}
    for t in sorted(THRESHOLDS.values(), key=lambda t: t.value):
        steps.setdefault(t.metric, []).append((t.value, "red" if t.name.endswith("critical") else "orange"))
    for metric in ("npudist_device_temperature_celsius", "npudist:node_device_temperature_celsius:max"):
        steps[metric] = [(min(lim.celsius for lim in LIMITS), "red")]
    return MappingProxyType({k: tuple(v) for k, v in steps.items()})


_THRESHOLD_STEPS = _threshold_steps()


def thresholds(p: Panel) -> list[tuple[float, str]]:
    """The panel's own steps, or those of the first catalogued metric its queries read."""
    if p.thresholds is not None:
        return list(p.thresholds)
    for q in p.queries:
        for metric, steps in _THRESHOLD_STEPS.items():
            if metric in q.expr:
                return list(steps)
    return []


def bounds(p: Panel) -> tuple[float | None, float | None]:
    if p.bounds is not None:
        return p.bounds
    return (0.0, 1.0) if p.unit == "percentunit" else (None, None)


def _field_defaults(p: Panel) -> dict[str, Any]:
    out: dict[str, Any] = {"unit": p.unit}
    lo, hi = bounds(p)
    if lo is not None:
        out["min"] = lo
    if hi is not None:
        out["max"] = hi
    steps = thresholds(p)
    if steps:
        out["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}]
                             + [{"color": c, "value": v} for v, c in steps]}
        out["custom"] = {"thresholdsStyle": {"mode": "line+area"}}
    return out


# Series that are zero throughout (an error counter that never moved) are hidden: a "fields with values"
# override (Grafana 10.3+, matcher byValue) on series whose largest value is <= 0. npudist's metrics are
# never negative, so that is exactly the all-zero ones.
def hide_zero_override() -> dict[str, Any]:
    """A field override hiding series whose maximum is 0 (a fresh dict: the dashboard JSON is edited later)."""
    return {"matcher": {"id": "byValue", "options": {"reducer": "max", "op": "lte", "value": 0}},
            "properties": [{"id": "custom.hideFrom", "value": {"legend": True, "tooltip": True, "viz": True}}]}


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    targets = [{"refId": chr(ord("A") + i), "datasource": dict(DATASOURCE), "expr": q.expr,
                "legendFormat": q.legend or "__auto", "range": p.type != "table", "instant": p.type == "table"}
               for i, q in enumerate(p.queries)]
    out: dict[str, Any] = {
        "id": pid, "type": p.type, "title": p.title, "description": p.description, "datasource": dict(DATASOURCE),
        "gridPos": {"h": _HEIGHT, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": _field_defaults(p), "overrides": []},
        "options": {}, "targets": targets,
    }
    if p.no_value:
        out["fieldConfig"]["defaults"]["noValue"] = p.no_value
    if p.type == "table":
        out["transformations"] = [{"id": "labelsToFields", "options": {}}]
    elif p.type == "timeseries":
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}}
        out["fieldConfig"]["overrides"] = [hide_zero_override()]
    return out


def _rows(panels: tuple[Panel, ...]) -> list[list[Panel]]:
    rows: list[list[Panel]] = [[]]
    used = 0
    for p in panels:
        if used + p.width > 24:
            rows.append([])
            used = 0
        rows[-1].append(p)
        used += p.width
    return rows


def dashboard_json(d: Dashboard) -> dict[str, Any]:
    """The importable dashboard document (``uid`` fixed so re-imports replace, not duplicate)."""
    panels: list[dict[str, Any]] = []
    for row_index, row in enumerate(_rows(d.panels)):
        x = 0
        for k, p in enumerate(row):
            doc = _panel(p, len(panels) + 1, x, row_index * _HEIGHT)
            if k == len(row) - 1:  # a full row: the last panel takes what is left of the 24 columns
                doc["gridPos"]["w"] = 24 - x
            panels.append(doc)
            x += p.width
    variables = [{"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
                  "current": {}, "hide": 0, "refresh": 1, "options": []}]
    variables += [_variable(v) for v in d.variables]
    return {
        "uid": d.uid, "title": d.title, "description": d.description, "tags": list(d.tags),
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "graphTooltip": 1,
        "templating": {"list": variables}, "annotations": {"list": []}, "panels": panels,
        # Every npudist board links to the others (they share the tag), keeping time range and variables.
        "links": [{"title": "npudist dashboards", "type": "dashboards", "tags": ["npudist"], "asDropdown": False,
                   "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False}],
    }
