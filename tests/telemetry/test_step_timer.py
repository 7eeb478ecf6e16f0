import logging
import math

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from npudist.telemetry.job import op_sampling
from npudist.telemetry.job.skew import describe, skew_report
from npudist.telemetry.job.step_timer import StepTimer, TrainingMetrics
from tests.telemetry.exp_helpers import families, samples


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fams(metrics: TrainingMetrics) -> dict:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(metrics)
    return families(generate_latest(reg).decode())


def test_context_manager_records_each_step():
    clock, metrics = FakeClock(), TrainingMetrics(["0", "0", "n1", "", ""])
    timer = StepTimer(metrics, exchange_every=0, clock=clock)
    for seconds in (0.004, 0.02, 0.3):
        with timer:
            clock.now += seconds
    fams = _fams(metrics)
    key = (("chip", ""), ("device", ""), ("local_rank", "0"), ("node", "n1"), ("rank", "0"))
    assert samples(fams, "npudist_steps", "npudist_steps_total") == {key: 3.0}
    with pytest.raises(ValueError, match="one per"):  # a short list would shift op/backend onto device/chip
        TrainingMetrics(["0", "0", "n1"])
    hist = fams["npudist_step_duration_seconds"]
    le = {s.labels["le"]: s.value for s in hist.samples if s.name.endswith("_bucket")}
    assert (le["0.001"], le["0.005"], le["0.025"], le["0.25"], le["0.5"], le["+Inf"]) == (0, 1, 2, 2, 3, 3)
    assert [s.value for s in hist.samples if s.name.endswith("_sum")] == [pytest.approx(0.324)]
    assert samples(fams, "npudist_step_skew_ratio") == {}  # no exchange yet: no sample


def test_step_call_form_and_single_process_exchange():
    clock, metrics = FakeClock(), TrainingMetrics()
    timer = StepTimer(metrics, exchange_every=2, clock=clock)
    assert timer.step() is None  # starts the clock
    for seconds in (0.1, 0.3):
        clock.now += seconds
        assert timer.step() == pytest.approx(seconds)
    report = timer.last_report
    assert report is not None and (report.first_step, report.last_step) == (1, 2)
    assert report.means == (pytest.approx(0.2),) and report.skew == 0.0 and report.straggler == 0


def test_counted_waits_leave_the_skew_window_but_not_the_step_time():
    clock, metrics = FakeClock(), TrainingMetrics()
    waited = [7.0]  # a cumulative counter, as npudist.ddp's hook keeps it; earlier waits are not a step's
    timer = StepTimer(metrics, exchange_every=3, clock=clock)
    timer.count_waits(lambda: waited[0])
    waited[0] += 5.0  # before the first step starts: not counted
    timer.step()
    for seconds, wait in ((0.1, 0.04), (0.3, 0.0), (0.2, 0.15)):
        clock.now += seconds
        waited[0] += wait
        assert timer.step() == pytest.approx(seconds)
    # working time per step: 0.06, 0.3, 0.05 -> mean 0.41 / 3
    assert timer.last_report.means == (pytest.approx(0.41 / 3),)
    hist = _fams(metrics)["npudist_step_duration_seconds"]
    assert [s.value for s in hist.samples if s.name.endswith("_sum")] == [pytest.approx(0.6)]


def test_pause_leaves_the_gap_out_and_drops_a_half_profiled_step():
    clock, metrics = FakeClock(), TrainingMetrics()
    timer = StepTimer(metrics, exchange_every=0, op_every=2, clock=clock)
    timer.step()
    clock.now += 0.1
    assert timer.step() == pytest.approx(0.1)  # step 1; step 2 is now being profiled
    torch.ones(4).softmax(0)
    timer.pause()  # e.g. evaluation
    clock.now += 50.0
    assert timer.step() is None  # restarts the clock, records nothing
    clock.now += 0.2
    assert timer.step() == pytest.approx(0.2)
    fams = _fams(metrics)
    assert samples(fams, "npudist_steps", "npudist_steps_total") == {
        (("chip", ""), ("device", ""), ("local_rank", "0"), ("node", ""), ("rank", "0")): 2.0}
    hist = fams["npudist_step_duration_seconds"]
    assert [s.value for s in hist.samples if s.name.endswith("_sum")] == [pytest.approx(0.3)]
    assert "npudist_op_duration_seconds" not in fams or not [
        s for s in fams["npudist_op_duration_seconds"].samples if s.name.endswith("_count")]


def test_skew_report_by_hand():
    # ranks 0-2 take 0.1 s, rank 3 0.2 s: mean 0.125, population std sqrt((3*0.025^2 + 0.075^2)/4) = 0.0433
    rows = [[0.1, 50.0, 1.8e9], [0.1, 51.0, 1.8e9], [0.1, math.nan, math.nan], [0.2, 88.5, 1.2e9]]
    r = skew_report(21, 40, rows)
    assert r.straggler == 3
    assert r.skew == pytest.approx(0.04330127 / 0.125, rel=1e-6)
    assert r.temperatures == (50.0, 51.0, None, 88.5)
    line = describe(r, 0.12)
    assert "rank 3 is slowest at 0.2000 s/step" in line
    assert "steps 21-40" in line and "88.5 C" in line and "1200 MHz" in line
    assert "n/a" in describe(skew_report(1, 2, [[0.1, math.nan, math.nan], [0.3, math.nan, math.nan]]), 0.12)


def test_equal_ranks_have_no_skew_and_ties_pick_the_lowest_rank():
    r = skew_report(1, 20, [[0.05, math.nan, math.nan]] * 3)
    assert r.skew == 0.0 and r.straggler == 0


def test_threshold_warning_is_logged_on_rank_zero(monkeypatch, caplog):
    from npudist.telemetry.job import step_timer

    monkeypatch.setattr(step_timer, "_all_gather_rows",
                        lambda row, group: ([row, [row[0] * 2, 70.0, 1.5e9]], 0))
    clock = FakeClock()
    timer = StepTimer(exchange_every=2, clock=clock)
    with caplog.at_level(logging.WARNING, logger="npudist.telemetry"):
        for _ in range(2):
            with timer:
                clock.now += 0.1
    assert timer.metrics.skew is not None and timer.metrics.skew.straggler == 1
    assert timer.metrics.skew.skew == pytest.approx(1 / 3)  # means 0.1 and 0.2: std 0.05 / mean 0.15
    assert "rank 1 is slowest at 0.2000 s/step" in caplog.text and "70.0 C" in caplog.text


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="exchange_every"):
        StepTimer(exchange_every=-1)
    with pytest.raises(ValueError, match="skew_threshold"):
        StepTimer(skew_threshold=0)


@pytest.mark.parametrize(("name", "family"), [
    ("aten::addmm", "matmul"), ("aten::mm", "matmul"), ("aten::bmm", "matmul"), ("aten::_softmax", "softmax"),
    ("aten::native_layer_norm", "layer_norm"), ("aten::native_layer_norm_backward", "layer_norm"),
    ("aten::linear", None), ("aten::layer_norm", None), ("aten::add", None), ("", None),
])
def test_op_names_are_normalised(name, family):
    assert op_sampling.normalise(name) == family


def test_profiled_step_feeds_operator_histograms():
    metrics = TrainingMetrics()
    timer = StepTimer(metrics, exchange_every=0, op_every=2)
    x = torch.randn(32, 32)
    for _ in range(3):
        with timer:
            torch.nn.functional.layer_norm((x @ x).softmax(-1), (32,))
    fams = _fams(metrics)
    counts = {s.labels["op"]: s.value for s in fams["npudist_op_duration_seconds"].samples
              if s.name.endswith("_count")}
    # only step 2 was profiled: exactly one call of each op
    assert counts == {"matmul": 1.0, "softmax": 1.0, "layer_norm": 1.0}
