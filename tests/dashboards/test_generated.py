"""Metric-name extraction, and the generated dashboards/rules checked against the catalogue."""

import json
from pathlib import Path

import pytest

from npudist.dashboards import DASHBOARDS, ExportOptions, check_dir, export, files
from npudist.dashboards.check import unknown_metrics
from npudist.dashboards.promql import PromQLError, metric_names, substitute
from npudist.dashboards.rules import rules_document
from tests.conftest import run_npudist


def test_metric_names_skip_functions_labels_and_keywords():
    expr = ('histogram_quantile(0.95, sum by (job, le) (rate(npudist_op_duration_seconds_bucket{op="matmul"}[5m])))'
            ' and on (node) max by (node) (npudist_device_up) > bool 0')
    assert metric_names(expr) == {"npudist_op_duration_seconds_bucket", "npudist_device_up"}
    assert metric_names('up{job=~"npudist.*"} == 0') == {"up"}
    with pytest.raises(PromQLError, match="unclosed"):
        metric_names("sum(rate(x[1m])")


def test_substitute_fills_grafana_variables():
    assert substitute('rate(a{job=~"$job", rank=~"${straggler}"}[$__rate_interval])', {"straggler": "1"}) == \
        'rate(a{job=~".*", rank=~"1"}[1m])'


def test_unknown_metric_and_bare_histogram_are_reported():
    assert unknown_metrics("npudist_step_duration_seconds", set()) == ["npudist_step_duration_seconds"]
    assert unknown_metrics("npudist_gpu_temp_c > 3", set()) == ["npudist_gpu_temp_c"]
    assert unknown_metrics("npudist:x", {"npudist:x"}) == []


def test_every_dashboard_has_the_variables_and_units():
    docs = {p: json.loads(t) for p, t in files().items() if p.startswith("grafana/")}
    assert len(docs) == len(DASHBOARDS) == 5
    for doc in docs.values():
        names = [v["name"] for v in doc["templating"]["list"]]
        assert names[:3] == ["datasource", "job", "node"]
        rank_queries = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])
                        if "npudist_steps_total" in t["expr"] or "npudist_rank_" in t["expr"]]
        # Two runs of one job stay apart: a board over rank metrics offers $run and its queries use it.
        assert not rank_queries or ("run" in names and all('run=~"$run"' in q for q in rank_queries)), doc["uid"]
    units = {p["fieldConfig"]["defaults"]["unit"] for d in docs.values() for p in d["panels"]}
    assert {"watt", "bytes", "celsius", "percentunit", "s", "Bps"} <= units


@pytest.mark.subprocess
def test_check_passes_the_export_and_names_a_broken_one(tmp_path):
    export(tmp_path)
    assert check_dir(tmp_path).problems == []
    board = tmp_path / "grafana" / "npudist-devices.json"
    doc = json.loads(board.read_text())
    doc["panels"][0]["targets"][0]["expr"] = "npudist_device_util_percent"
    doc["panels"][1]["fieldConfig"]["defaults"]["unit"] = "mW"
    board.write_text(json.dumps(doc))
    problems = "\n".join(check_dir(tmp_path).problems)
    assert "npudist_device_util_percent" in problems and "'mW'" in problems


@pytest.mark.subprocess
def test_cli_export_then_check(tmp_path):
    res = run_npudist(["dashboards", "export", "--out", str(tmp_path)], timeout=60)
    assert res.returncode == 0, res.stderr
    assert all(Path(line).is_file() for line in res.stdout.splitlines())  # stdout: only the files written
    steps = " ".join(res.stderr.split())  # the next steps, with this folder's paths
    assert f"npudist dashboards check {tmp_path}" in steps
    assert f"prometheus --config.file={tmp_path / 'prometheus' / 'prometheus.yml'}" in steps
    assert "--targets-file /etc/prometheus/sd/npudist.json" in steps and "npudist observe" in steps
    for rel in ("grafana/npudist-training.json", "prometheus/rules.yml", "prometheus/prometheus.yml",
                "provisioning/datasources/npudist.yml", "provisioning/dashboards/npudist.yml"):
        assert (tmp_path / rel).is_file(), rel
    res = run_npudist(["dashboards", "check", str(tmp_path)], timeout=120)
    assert res.returncode == 0, res.stderr
    assert "0 problem(s)" in res.stdout
    res = run_npudist(["dashboards", "check", str(tmp_path / "nope")], timeout=60)
    assert res.returncode == 2 and "npudist dashboards export --out" in res.stderr


def test_every_alert_has_a_runbook_section_and_a_severity():
    from npudist.dashboards import ALERTS
    from tests.conftest import REPO

    headings = {line[3:].strip().lower() for line in (REPO / "docs" / "runbook.md").read_text().splitlines()
                if line.startswith("## ")}
    assert {a.anchor for a in ALERTS} == headings
    assert {a.severity for a in ALERTS} == {"P1", "P2", "P3"}


@pytest.mark.subprocess
def test_alerts_carry_kube_prometheus_severity_and_an_absolute_runbook_url(tmp_path):
    import yaml

    res = run_npudist(["dashboards", "export", "--out", str(tmp_path),
                       "--runbook-url", "https://wiki.example/npudist/runbook"], timeout=240)
    assert res.returncode == 0, res.stderr
    alerts = [r for g in yaml.safe_load((tmp_path / "prometheus" / "rules.yml").read_text())["groups"]
              for r in g["rules"] if "alert" in r]
    pairs = {(r["labels"]["severity"], r["labels"]["priority"]) for r in alerts}
    assert pairs == {("critical", "P1"), ("warning", "P2"), ("info", "P3")}
    for r in alerts:
        assert r["annotations"]["runbook_url"] == f"https://wiki.example/npudist/runbook#{r['alert'].lower()}"
    assert check_dir(tmp_path).problems == []
    bad = run_npudist(["dashboards", "export", "--out", str(tmp_path), "--runbook-url", "docs/runbook.md"],
                      timeout=240)
    assert bad.returncode == 2 and "must be absolute" in bad.stderr


def test_rank_and_node_exporter_down_are_separate_alerts():
    from npudist.dashboards import ALERTS

    by_name = {a.name: a for a in ALERTS}
    assert "npudist-(node|exporter)" in by_name["NpudistExporterDown"].expr
    assert "and on (job)" in by_name["NpudistRankDown"].expr  # only while the job's other ranks are up


def test_alerts_and_docs_use_the_shared_thresholds():
    import re

    from npudist.dashboards import rules
    from npudist.telemetry.exposition import thresholds
    from tests.conftest import REPO

    by_alert = {a.name: a for a in rules.ALERTS}
    docs = (REPO / "docs" / "guide" / "observing.md").read_text() + (REPO / "docs" / "runbook.md").read_text()
    for t in thresholds.THRESHOLDS.values():
        alert = by_alert[t.alert]
        assert re.search(rf"> {re.escape(f'{t.value:g}')}\)?$", alert.expr), alert.expr
        assert alert.for_ == t.for_ and t.for_words in alert.summary
        assert t.text in docs or f"{t.value * 1e6:g} µs" in docs, f"docs do not name {t.name} = {t.text}"
    # Written once: no module that applies a threshold spells its value out.
    src = REPO / "src" / "npudist"
    for rel in ("dashboards/rules.py", "dashboards/panels.py", "diagnosis/straggler/skew.py",
                "telemetry/job/straggler.py", "telemetry/job/step_timer.py"):
        text = (src / rel).read_text()
        for literal in ("0.12", "0.30", "0.3 ", "0.0008", "800 us", "> 10", "> 8", "30 %"):
            assert literal not in text, f"{rel} repeats threshold {literal!r}: read thresholds.THRESHOLDS"


def test_every_panel_has_a_description():
    missing = [f"{d.title} / {p.title}" for d in DASHBOARDS for p in d.panels if len(p.description.strip()) < 20]
    assert missing == []


def test_thresholds_bounds_links_and_full_rows():
    from npudist.dashboards.limits import LIMITS
    from npudist.telemetry.exposition.thresholds import SKEW_REFERENCE, THRESHOLDS

    docs = {json.loads(t)["uid"]: json.loads(t) for p, t in files().items() if p.startswith("grafana/")}
    panels = {(uid, p["title"]): p for uid, d in docs.items() for p in d["panels"]}

    def steps(uid, title):
        return [s["value"] for s in panels[(uid, title)]["fieldConfig"]["defaults"]["thresholds"]["steps"]][1:]

    assert steps("npudist-training", "Cross-rank skew") == [SKEW_REFERENCE]
    assert steps("npudist-communication", "In-flight collectives (backlog)") == [
        THRESHOLDS["backlog"].value, THRESHOLDS["backlog_critical"].value]
    assert steps("npudist-memory", "Fragmentation per rank") == [THRESHOLDS["fragmentation"].value]
    assert steps("npudist-operators", "Mean duration per operator and rank") == [THRESHOLDS["matmul_seconds"].value]
    assert steps("npudist-devices", "Temperature") == [min(lim.celsius for lim in LIMITS)]
    for (_uid, title), p in panels.items():
        if p["fieldConfig"]["defaults"]["unit"] == "percentunit":
            assert (p["fieldConfig"]["defaults"]["min"], p["fieldConfig"]["defaults"]["max"]) == (0, 1), title
    for (_uid, title), p in panels.items():
        if p["type"] == "timeseries":  # all-zero series hidden
            assert p["fieldConfig"]["overrides"][0]["matcher"]["id"] == "byValue", title
    for uid, d in docs.items():
        assert d["links"][0]["type"] == "dashboards" and d["links"][0]["tags"] == ["npudist"], uid
        rows: dict[int, int] = {}
        for p in d["panels"]:
            rows[p["gridPos"]["y"]] = rows.get(p["gridPos"]["y"], 0) + p["gridPos"]["w"]
        assert set(rows.values()) == {24}, (uid, rows)  # every row full, no gaps


def test_loss_throughput_and_checkpoint_panels_and_failure_alert():
    from npudist.dashboards import ALERTS

    exprs = " ".join(q.expr for d in DASHBOARDS for p in d.panels for q in p.queries)
    for metric in ("npudist_training_loss", "npudist_training_samples_per_second",
                   "npudist_checkpoint_snapshot_duration_seconds", "npudist_checkpoint_write_duration_seconds",
                   "npudist_checkpoint_bytes_total", "npudist_checkpoint_failures_total"):
        assert metric in exprs, metric
    (failed,) = [a for a in ALERTS if a.name == "NpudistCheckpointFailed"]
    assert "npudist_checkpoint_failures_total" in failed.expr


@pytest.mark.subprocess
@pytest.mark.parametrize("url", ["https://wiki.example/{{ $labels.job }}/runbook", "https://wiki.example/run book",
                                 "https://wiki.example/a|b"])
def test_a_runbook_url_prometheus_would_template_is_refused(tmp_path, url):
    """Third audit: `{{` in --runbook-url made every alert rule invalid while the export exited 0."""
    out = tmp_path / "out"
    bad = run_npudist(["dashboards", "export", "--out", str(out), "--runbook-url", url], timeout=240)
    text = " ".join(bad.stderr.split())
    assert bad.returncode == 2 and "percent-encode" in text and "Traceback" not in text, bad.stderr
    assert not out.exists()  # nothing half-written
    with pytest.raises(ValueError, match="percent-encode"):
        rules_document(runbook_url=url)


@pytest.mark.subprocess
def test_check_names_a_templated_runbook_url_in_a_hand_edited_export(tmp_path):
    import yaml

    export(tmp_path, ExportOptions())
    rules = tmp_path / "prometheus" / "rules.yml"
    doc = yaml.safe_load(rules.read_text())
    alert = next(r for g in doc["groups"] for r in g["rules"] if "alert" in r)
    alert["annotations"]["runbook_url"] = "https://x/{{ .Foo }}#a"
    rules.write_text(yaml.safe_dump(doc))
    assert any(f"alert {alert['alert']}: runbook_url" in p and "percent-encode" in p
               for p in check_dir(tmp_path).problems)
