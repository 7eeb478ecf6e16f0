"""The report's "Where each step goes": the run log's per-window phases (skew records) as a chart of the
median and largest per phase over ranks, and the windows in which the others waited for one rank's phase."""

import json
import math

from npudist.diagnosis.straggler.skew import skew_report
from npudist.report import build, load_run
from npudist.report.render import render
from npudist.telemetry.job.run_log import skew_record

NAN = math.nan
# Two 2-rank windows as the StepTimer exchanges them: (work, vitals x3, device, chip, data, blocked comm,
# other, compute). Steps 1-20 even; steps 21-40 rank 1 loads its batches 40 ms longer and rank 0 waits.
EVEN = [[0.0049, NAN, NAN, NAN, NAN, NAN, 0.0003, 0.0021, 0.0006, 0.0040]] * 2
SLOW = [[0.0049, NAN, NAN, NAN, NAN, NAN, 0.0003, 0.0431, 0.0006, 0.0040],
        [0.0447, NAN, NAN, NAN, NAN, NAN, 0.0406, 0.0019, 0.0005, 0.0036]]


def _run(tmp_path, windows):
    (tmp_path / "metrics").mkdir()
    lines = [{"v": 1, "time": 1000.0 + i, "rank": 0, **skew_record(skew_report(20 * i + 1, 20 * i + 20, rows))}
             for i, rows in enumerate(windows)]
    (tmp_path / "metrics" / "rank0.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return build(load_run(tmp_path))


def test_the_run_log_carries_each_ranks_phases_and_the_report_charts_them(tmp_path):
    data = _run(tmp_path, [EVEN, SLOW])
    assert not data.problems
    series = {s.name: dict(s.points) for s in data.phases}
    assert series["data, largest over ranks"][40.0] == 0.0406
    assert series["data, median over ranks"][40.0] == (0.0003 + 0.0406) / 2
    # rank 0's 43.1 ms blocked, less rank 1's 1.9 ms (the transfer estimate), is its wait
    assert math.isclose(series["comm_wait, largest over ranks"][40.0], 0.0412, rel_tol=1e-6)
    assert data.culprits == (("21-40", "rank 1: data +40 ms per step", "86%"),)
    page = render(data, "run")
    assert 'id="phases"' in page and "rank 1: data +40 ms per step" in page


def test_a_run_log_without_phases_says_how_to_get_them(tmp_path):
    (tmp_path / "metrics").mkdir()
    old = {"v": 1, "time": 1000.0, "rank": 0, "kind": "skew", "first_step": 1, "last_step": 20, "skew": 0.1,
           "straggler": 1, "means": [0.1, 0.12]}
    (tmp_path / "metrics" / "rank0.jsonl").write_text(json.dumps(old) + "\n")
    data = build(load_run(tmp_path))
    assert data.phases == () and data.culprits == () and data.skew
    assert "Phases come with the skew windows" in render(data, "run")
