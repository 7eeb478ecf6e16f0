"""The sentinel's pure rules (npudist/diagnosis/nonfinite.py): the stop line, the spike rule, GradScaler skips."""

from __future__ import annotations

import math

import pytest

from npudist.diagnosis.nonfinite import SPIKE_WARNINGS, Culprit, NonFiniteStop, SkipStreak, SpikeRule


def test_the_stop_line_names_rank_host_card_step_and_what_went_non_finite():
    stop = NonFiniteStop(step=30, culprits=(
        Culprit(rank=1, host="node2", card="npu:5", loss=math.inf),
        Culprit(rank=3, host="node4", card="npu:1", first="bucket 2 (blocks.0.weight)"),
    ))
    line = stop.line()
    assert "step 30" in line
    assert "rank 1 (host node2, card npu:5): loss=inf" in line
    assert "rank 3 (host node4, card npu:1): first non-finite gradient in bucket 2 (blocks.0.weight)" in line
    assert "\n" not in line
    assert stop.as_json()["culprits"][0] == {"rank": 1, "host": "node2", "card": "npu:5", "loss": "inf",
                                            "first": None}


def test_without_a_culprit_the_line_names_the_gradient_and_how_to_find_the_rank():
    line = NonFiniteStop(step=7, culprits=(), gradient="head.weight").line()
    assert "step 7" in line and "head.weight" in line and "NPUDIST_SENTINEL=scan" in line


def test_many_culprits_are_cut_to_eight_and_counted():
    many = tuple(Culprit(rank=r, host="h", card="c", loss=math.nan) for r in range(11))
    line = NonFiniteStop(step=1, culprits=many).line()
    assert "rank 7 " in line and "rank 8 " not in line and "and 3 more rank(s)" in line


def test_a_loss_above_ten_times_its_running_maximum_warns_and_does_not_raise_the_maximum():
    rule = SpikeRule()
    for step, loss in enumerate([2.0, 1.5, 1.0], 1):
        assert rule.check(step, loss, rank=0) is None
    line = rule.check(4, 20.5, rank=1)
    assert line is not None and "step 4 on rank 1" in line and "10.2x" in line and "maximum 2 " in line
    assert rule.maximum == 2.0  # the spike is not the new normal
    assert rule.check(5, 19.9, rank=0) is None  # below 10 x 2.0
    assert rule.check(6, math.nan, rank=0) is None  # non-finite is the stop's business


def test_spike_lines_stop_after_a_few():
    rule = SpikeRule(factor=2.0)
    rule.check(1, 1.0, rank=0)
    lines = [rule.check(s, 5.0, rank=0) for s in range(2, 12)]
    shown = [x for x in lines if x]
    assert len(shown) == SPIKE_WARNINGS and "not shown" in shown[-1]


@pytest.mark.parametrize("factor", [1.0, 0.5, -3.0])
def test_a_spike_factor_at_or_below_one_is_refused(factor):
    with pytest.raises(ValueError, match="above 1"):
        SpikeRule(factor)


def test_gradscaler_skips_warn_only_after_many_in_a_row():
    streak = SkipStreak(warn_after=3)
    assert streak.skipped(True, 10) is None and streak.skipped(True, 11) is None
    streak.stepped()  # an update went through: the scaler recovered
    assert [streak.skipped(True, s) for s in (12, 13)] == [None, None]
    line = streak.skipped(True, 14)
    assert line is not None and "3 optimizer steps in a row" in line and "step 14" in line
    assert streak.skipped(False, 15) is None  # nothing non-finite: not a skip
    assert streak.count == 3
