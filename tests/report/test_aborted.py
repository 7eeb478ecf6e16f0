"""A run npudist stopped (a hang verdict, the NaN sentinel's stop) says so at the top of its report, with the
verdict; `npudist diagnose` reads the sentinel's stop record too (issue 44, item 5)."""

from __future__ import annotations

import json

from npudist.diagnosis.nonfinite import Culprit, NonFiniteStop
from npudist.report.diagnose import diagnose
from npudist.report.model import build
from npudist.report.records import load_run
from npudist.report.render import render
from tests.report.runs import write_run


def _stop_record(root, step=30):
    stop = NonFiniteStop(step=step, culprits=(Culprit(rank=1, host="n1", card="npu:5", loss=float("inf")),))
    (root / f"nonfinite-step{step}.json").write_text(json.dumps({**stop.as_json(), "time": 1_700_000_000.0}))
    return stop


def test_a_run_stopped_on_a_nan_leads_its_report_with_the_verdict(tmp_path):
    root = write_run(tmp_path / "run")
    stop = _stop_record(root)
    data = build(load_run(root))
    assert [(v.kind, v.rank, v.place.host) for v in data.aborted] == [("nonfinite", 1, "n1")]
    page = render(data, "run")
    banner = page.index('id="aborted"')
    assert banner < page.index('id="card"')  # before everything else
    assert "Aborted: a loss or gradient went NaN/Inf" in page[banner:]
    assert "step 30 on rank 1 (host n1, card npu:5): loss=inf" in page[banner:page.index('id="card"')]
    assert stop.line().startswith("npudist: non-finite at step 30")


def test_a_hang_verdict_file_and_its_copy_per_rank_make_one_line_at_the_top(tmp_path):
    root = write_run(tmp_path / "run")
    hang = {"line": "npudist hang: no progress for 30.0 s; rank(s) 1 never reached it", "culprits": [1],
            "culprit_ranks": {"1": {"host": "n2", "pid": 77}}, "time": 1_700_000_000.0}
    (root / "hang-attempt0.json").write_text(json.dumps(hang))
    (root / "hang-rank1.json").write_text(json.dumps({"verdict": hang}))
    data = build(load_run(root))
    assert [(v.kind, v.rank) for v in data.aborted] == [("hang", 1)]
    page = render(data, "run")
    assert page.index("Aborted: the job hung") < page.index('id="card"')


def test_a_run_that_was_not_stopped_has_no_banner_and_a_broken_record_is_a_problem(tmp_path):
    root = write_run(tmp_path / "run")
    assert 'id="aborted"' not in render(build(load_run(root)), "run")
    (root / "nonfinite-step3.json").write_text("{not json")
    run = load_run(root)
    assert run.abort_docs == {} and [p.source for p in run.problems] == ["nonfinite-step3.json"]


def test_diagnose_reads_the_stop_record_first_after_a_hang(tmp_path):
    root = write_run(tmp_path / "run")
    _stop_record(root)
    (root / "step-00000010").mkdir()  # no manifest.json: a checkpoint verdict, less severe
    found = diagnose(root)
    assert [v.kind for v in found.verdicts] == ["nonfinite", "checkpoint"]
    assert found.verdicts[0].rank == 1 and "step 30" in found.verdicts[0].summary
