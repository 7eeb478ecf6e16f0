"""``npudist dashboards check DIR``: are the exported files sound?

Checks: dashboard JSON structure (datasource, job and node variables; panels with a known type and unit and
at least one query), every query and rule expression is PromQL (``promtool`` parses them when it is on
PATH; otherwise only brackets and strings are checked, and the report says so), and every metric a query
or rule reads exists in the metric catalogue (histograms only as ``_bucket``/``_sum``/``_count``) or is
recorded by a rule in prometheus/rules.yml.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from npudist.dashboards.panels import GRAFANA_UNITS, PANEL_TYPES
from npudist.dashboards.promql import PromQLError, metric_names, substitute
from npudist.dashboards.rules import runbook_url_problem
from npudist.telemetry.exposition.catalogue import BY_NAME

BUILTINS = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})
"""Series Prometheus itself creates."""
REQUIRED_VARIABLES = ("datasource", "job", "node")
PROMTOOL_TIMEOUT_S = 60


@dataclass
class CheckResult:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    queries: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def known_series() -> set[str]:
    """Series names the catalogue produces (a histogram gives _bucket, _sum and _count, never its bare name)."""
    names: set[str] = set()
    for m in BY_NAME.values():
        if m.type == "histogram":
            names.update(f"{m.name}{s}" for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(m.name)
    return names


def unknown_metrics(expr: str, recorded: set[str]) -> list[str]:
    """Metric names in ``expr`` that neither the catalogue, a recording rule nor Prometheus provides."""
    allowed = known_series() | recorded | BUILTINS
    return sorted(n for n in metric_names(substitute(expr)) if n not in allowed)


def dashboard_problems(doc: Any, where: str) -> tuple[list[str], list[str]]:
    """(problems, queries) of one dashboard document."""
    if not isinstance(doc, dict):
        return [f"{where}: not a JSON object"], []
    out: list[str] = []
    for key in ("uid", "title", "panels", "templating"):
        if key not in doc:
            out.append(f"{where}: missing {key!r}")
    names = {v.get("name") for v in doc.get("templating", {}).get("list", []) if isinstance(v, dict)}
    for var in REQUIRED_VARIABLES:
        if var not in names:
            out.append(f"{where}: no {var!r} variable (every npudist dashboard has {', '.join(REQUIRED_VARIABLES)})")
    queries: list[str] = []
    for i, panel in enumerate(doc.get("panels", [])):
        pw = f"{where} panel {i} ({panel.get('title', '?') if isinstance(panel, dict) else '?'})"
        if not isinstance(panel, dict):
            out.append(f"{pw}: not an object")
            continue
        if panel.get("type") not in PANEL_TYPES:
            out.append(f"{pw}: type {panel.get('type')!r} is not one of {sorted(PANEL_TYPES)}")
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit not in GRAFANA_UNITS:
            out.append(f"{pw}: unit {unit!r} is not one of {sorted(GRAFANA_UNITS)}")
        targets = [t for t in panel.get("targets", []) if isinstance(t, dict) and t.get("expr")]
        if not targets:
            out.append(f"{pw}: no query")
        queries.extend(t["expr"] for t in targets)
    return out, queries


def rule_exprs(doc: Any) -> tuple[list[str], set[str], list[str]]:
    """(problems, recorded names, expressions) of a rules document."""
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        return ["prometheus/rules.yml: no 'groups' list"], set(), []
    problems, recorded, exprs = [], set(), []
    for g in doc["groups"]:
        for r in g.get("rules", []):
            exprs.append(str(r.get("expr", "")))
            if "record" in r:
                recorded.add(r["record"])
            elif "alert" in r:
                ann, labels = r.get("annotations", {}), r.get("labels", {})
                if labels.get("severity") not in ("critical", "warning", "info"):
                    problems.append(f"alert {r['alert']}: severity label must be critical, warning or info")
                if labels.get("priority") not in ("P1", "P2", "P3"):
                    problems.append(f"alert {r['alert']}: priority label must be P1, P2 or P3")
                for key in ("summary", "description", "runbook_url"):
                    if not ann.get(key):
                        problems.append(f"alert {r['alert']}: no {key!r} annotation")
                url_problem = runbook_url_problem(str(ann.get("runbook_url", "")).split("#", 1)[0])
                if url_problem is not None:
                    problems.append(f"alert {r['alert']}: runbook_url {url_problem}")
    return problems, recorded, exprs


def promtool_parse(exprs: list[str], promtool: str) -> list[str]:
    """Parse errors from promtool for each expression (as recording rules in a scratch file)."""
    doc = {"groups": [{"name": "check", "rules": [{"record": f"check:q{i}", "expr": e}
                                                  for i, e in enumerate(exprs)]}]}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "queries.yml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        proc = subprocess.run([promtool, "check", "rules", "--lint=none", str(path)], capture_output=True,
                              text=True, timeout=PROMTOOL_TIMEOUT_S, check=False)
    if proc.returncode == 0:
        return []
    return [f"promtool: {line.strip()}" for line in (proc.stdout + proc.stderr).splitlines()
            if line.strip() and "Checking" not in line]


def check_dir(root: Path, promtool: str | None = None) -> CheckResult:
    """Every problem with an exported folder (empty ``problems`` when it is sound)."""
    root = Path(root)
    res = CheckResult()
    promtool = promtool or shutil.which("promtool")
    rules_path = root / "prometheus" / "rules.yml"
    recorded: set[str] = set()
    exprs: list[str] = []
    if not rules_path.is_file():
        res.problems.append(f"{rules_path}: missing (run `npudist dashboards export --out {root}`)")
    else:
        try:
            problems, recorded, rule_exprs_ = rule_exprs(yaml.safe_load(rules_path.read_text(encoding="utf-8")))
        except yaml.YAMLError as exc:
            problems, rule_exprs_ = [f"{rules_path}: not YAML: {exc}"], []
        res.problems += problems
        exprs += rule_exprs_
    boards = sorted((root / "grafana").glob("*.json"))
    if not boards:
        res.problems.append(f"{root / 'grafana'}: no dashboards (*.json)")
    for path in boards:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            res.problems.append(f"{path.name}: not JSON: {exc}")
            continue
        problems, queries = dashboard_problems(doc, path.name)
        res.problems += problems
        exprs += [substitute(q) for q in queries]
        res.queries += len(queries)
    for e in exprs:
        try:
            missing = unknown_metrics(e, recorded)
        except PromQLError as exc:
            res.problems.append(str(exc))
            continue
        if missing:
            res.problems.append(f"unknown metric(s) {', '.join(missing)} in {e!r}: not in "
                                "npudist.telemetry.exposition.catalogue nor recorded by prometheus/rules.yml")
    if promtool:
        res.problems += promtool_parse(exprs, promtool)
        if rules_path.is_file():
            proc = subprocess.run([promtool, "check", "rules", str(rules_path)], capture_output=True, text=True,
                                  timeout=PROMTOOL_TIMEOUT_S, check=False)
            if proc.returncode != 0:
                res.problems.append(f"promtool check rules {rules_path}: {proc.stdout.strip()} {proc.stderr.strip()}")
    else:
        res.notes.append("promtool not on PATH: queries checked for brackets and metric names only "
                         "(install Debian's `prometheus` package for a full PromQL parse)")
    return res
