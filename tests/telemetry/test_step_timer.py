import logging
import math
import re

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from npudist.diagnosis.straggler.skew import skew_report
from npudist.telemetry.job import op_sampling
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
    clock, metrics = FakeClock(), TrainingMetrics(["0", "0", "n1", "", "", ""])
    timer = StepTimer(metrics, exchange_every=0, clock=clock)
    for seconds in (0.004, 0.02, 0.3):
        with timer:
            clock.now += seconds
    fams = _fams(metrics)
    key = (("chip", ""), ("device", ""), ("local_rank", "0"), ("node", "n1"), ("rank", "0"), ("run", ""))
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
        (("chip", ""), ("device", ""), ("local_rank", "0"), ("node", ""), ("rank", "0"), ("run", "")): 2.0}
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
    assert r.data_waits == r.comm_waits == (None,) * 4  # rows without the section columns


def test_equal_ranks_have_no_skew_and_ties_pick_the_lowest_rank():
    r = skew_report(1, 20, [[0.05, math.nan, math.nan]] * 3)
    assert r.skew == 0.0 and r.straggler == 0


def test_straggler_warned_once_when_flagged_and_once_when_it_recovers(monkeypatch, caplog):
    from npudist.telemetry.job import step_timer

    # 4 ranks, 1 % alternating noise; rank 1 runs 1.5x from the 6th window to the 11th, with its data wait.
    window = [0]

    def gather(row, group):
        k = window[0]
        window[0] += 1
        rows = [[row[0] * (1.01 if (k + r) % 2 else 0.99), 60.0, 1.5e9, 0.9, float(r), 0.0, 0.001, 0.002]
                for r in range(4)]
        if 5 <= k < 11:
            rows[1][0] *= 1.5
        return rows, 0

    monkeypatch.setattr(step_timer, "_all_gather_rows", gather)
    clock = FakeClock()
    timer = StepTimer(exchange_every=1, clock=clock)
    flagged = []
    with caplog.at_level(logging.WARNING, logger="npudist.telemetry"):
        for _ in range(16):
            with timer:
                clock.now += 0.1
            flagged.append(timer.last_report.flagged)
    assert all(f == () for f in flagged[:5]) and all(f == () for f in flagged[11:])
    assert (1,) in flagged[5:8] and all(f in ((), (1,)) for f in flagged)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("straggler:")]
    assert len(lines) == 2, lines  # not one per window
    works = re.search(r"rank 1 \(device 1 chip 0\) works ([\d.]+)x", lines[0])
    assert works and 1.45 <= float(works.group(1)) <= 1.55 and "cause: compute" in lines[0], lines[0]
    assert "60.0 C" in lines[0] and "1500 MHz" in lines[0]
    assert "rank 1 (device 1 chip 0) recovered" in lines[1]
    fams = _fams(timer.metrics)
    assert samples(fams, "npudist_rank_straggler") == {
        (("chip", ""), ("device", ""), ("local_rank", "0"), ("node", ""), ("rank", "0"), ("run", "")): 0.0}
    assert "npudist_straggler_rank" not in fams or not fams["npudist_straggler_rank"].samples  # none flagged


def test_flagged_rank_exports_its_flag_and_rank_zero_names_it(monkeypatch):
    from npudist.telemetry.job import step_timer

    rows = [[0.1 * (1 + 0.01 * ((k * 7 + r) % 3)), *[math.nan] * 5, 0.0, 0.0] for r in range(8) for k in (0,)]
    calls = [0]

    def gather(row, group):
        calls[0] += 1
        out = [[v * (1 + 0.01 * ((calls[0] + i) % 3)) if j == 0 else v for j, v in enumerate(r)]
               for i, r in enumerate(rows)]
        out[5][0] *= 2.0
        return out, 0

    monkeypatch.setattr(step_timer, "_all_gather_rows", gather)
    for me in (0, 5):
        metrics = TrainingMetrics([str(me), str(me), "n1", "", "", ""])
        timer = StepTimer(metrics, exchange_every=1, clock=FakeClock())
        calls[0] = 0
        for _ in range(8):
            timer.step()
        metrics.rank = me  # what the exchange reports on that rank
        fams = _fams(metrics)
        key = (("chip", ""), ("device", ""), ("local_rank", str(me)), ("node", "n1"), ("rank", str(me)), ("run", ""))
        assert samples(fams, "npudist_rank_straggler") == {key: 1.0 if me == 5 else 0.0}
        ratio = samples(fams, "npudist_rank_slowdown_ratio")[key]
        assert ratio == pytest.approx(2.0, rel=0.05) if me == 5 else ratio == pytest.approx(1.0, rel=0.05)
        assert (samples(fams, "npudist_straggler_rank") == {key: 5.0}) == (me == 0)


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="exchange_every"):
        StepTimer(exchange_every=-1)
    with pytest.raises(ValueError, match="false_rate"):
        StepTimer(straggler_settings={"false_rate": 0})
    with pytest.raises(TypeError):
        StepTimer(straggler_settings={"no_such_setting": 1})


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


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, -0.5, 1e308])
def test_a_window_mean_no_clock_gives_is_unknown_and_training_goes_on(monkeypatch, bad):
    """Third audit: one rank's corrupt mean raised inside skew_report, in step(), on every rank at once."""
    from npudist.telemetry.job import step_timer

    def gather(row, group):
        return [[0.1, *[math.nan] * 7], [bad, *[math.nan] * 7], [0.3, *[math.nan] * 7], [bad, *[math.nan] * 7]], 0

    monkeypatch.setattr(step_timer, "_all_gather_rows", gather)
    metrics = TrainingMetrics(["0", "0", "n1", "", "", ""])
    timer = StepTimer(metrics, exchange_every=1, clock=FakeClock())
    for _ in range(3):
        timer.step()
    r = timer.last_report
    assert r.means[0] == 0.1 and r.means[2] == 0.3 and math.isnan(r.means[1]) and math.isnan(r.means[3])
    assert r.straggler == 2 and r.skew == pytest.approx(0.1 / 0.2)  # over the two ranks with a clock
    assert "npudist_rank_straggler" in _fams(metrics)  # the scrape still renders after that window
    assert skew_report(1, 2, [[bad], [bad]]).skew == 0.0


def test_phase_counters_sum_to_the_step_time_and_split_comm_with_the_peers_least_blocked_time(monkeypatch):
    from npudist.telemetry.job import step_timer

    # This rank: 5 ms between steps (other), 2 ms for its batch, 30 ms blocked at the end of backward, 100 ms
    # steps. Its peer's rows say it was blocked 4 ms a step: that is the transfer from the first exchange on.
    sent = []

    def gather(row, group):
        sent.append(row)
        return [row, [row[0] + 0.026, *row[1:6], 0.028, 0.004, 0.005, 0.063]], 0

    monkeypatch.setattr(step_timer, "_all_gather_rows", gather)
    clock, metrics, blocked = FakeClock(), TrainingMetrics(), [0.0]
    timer = StepTimer(metrics, exchange_every=2, clock=clock)
    timer.count_comm(lambda: blocked[0])
    timer.step()
    for _ in range(4):
        clock.now += 0.005
        timer.add_data_wait(0.002, at=clock.now)
        clock.now += 0.095
        blocked[0] += 0.030
        timer.step()
    fams = _fams(metrics)
    phases = {dict(k)["phase"]: v for k, v in
              samples(fams, "npudist_rank_phase_seconds", "npudist_rank_phase_seconds_total").items()}
    assert phases == pytest.approx({"other": 0.020, "data": 0.008, "compute": 0.252, "comm_wait": 0.052,
                                    "comm_transfer": 0.068})  # steps 1-2: all transfer; 3-4: 4 ms each
    (step_sum,) = samples(fams, "npudist_step_duration_seconds", "npudist_step_duration_seconds_sum").values()
    assert step_sum == pytest.approx(0.4) and sum(phases.values()) == pytest.approx(step_sum)
    assert sent[0][6:] == pytest.approx([0.002, 0.030, 0.005, 0.063])  # data, comm, other, compute per step
    assert timer.transfer_s == pytest.approx(0.004)


def test_rank_zero_names_the_rank_the_others_wait_for_once(monkeypatch, caplog):
    from npudist.telemetry.job import step_timer

    nan = math.nan
    slow = [[0.0049, nan, nan, nan, nan, nan, 0.0003, 0.0431, 0.0006, 0.0040],
            [0.0447, nan, nan, nan, nan, nan, 0.0406, 0.0019, 0.0005, 0.0036]]
    even = [[0.0049, nan, nan, nan, nan, nan, 0.0003, 0.0021, 0.0006, 0.0040]] * 2
    windows = iter([even, slow, slow, slow, even])  # rank 0 waits 41.2 of 48.0 ms: 86 %
    monkeypatch.setattr(step_timer, "_all_gather_rows", lambda row, group: (next(windows), 0))
    timer = StepTimer(exchange_every=1, clock=FakeClock())
    with caplog.at_level(logging.WARNING, logger="npudist.telemetry"):
        for _ in range(6):
            timer.step()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("phases:")]
    assert lines == ["phases: rank 1: data +40 ms per step over steps 2-2; the other ranks wait 86% of their "
                     "step for it in communication", "phases: no rank keeps the others waiting over steps 5-5"]
