"""The phase split and the culprit rule (diagnosis/straggler/phases.py), on recorded window numbers."""

import math

import pytest

from npudist.diagnosis.straggler.phases import (
    PHASES,
    StepPhases,
    culprit,
    split_step,
    transfer_estimate,
    wait_ratio,
    window_phases,
)
from npudist.diagnosis.straggler.skew import skew_report


def test_a_step_splits_into_phases_that_sum_to_it_exactly():
    p = split_step(step_s=0.100, data_s=0.040, comm_s=0.030, other_s=0.005, transfer_s=0.004)
    assert p == StepPhases(data=0.040, compute=pytest.approx(0.025), comm_wait=pytest.approx(0.026),
                           comm_transfer=0.004, other=0.005)
    assert math.isclose(p.total, 0.100) and [name for name, _ in p.items()] == list(PHASES)


def test_overlapping_clocks_never_make_a_phase_negative_or_the_sum_larger():
    # The DDP bucket wait and the data time together exceed the step (clocks read on two threads): the
    # later phases get what is left, compute is 0, nothing negative.
    p = split_step(step_s=0.050, data_s=0.030, comm_s=0.040, other_s=0.0)
    assert p.data == 0.030 and p.comm == pytest.approx(0.020) and p.compute == 0.0
    assert math.isclose(p.total, 0.050)
    bad = split_step(step_s=0.010, data_s=math.nan, comm_s=-1.0, other_s=math.inf)
    assert bad.other == 0.0 and bad.data == 0.0 and bad.comm == 0.0 and bad.compute == 0.010


def test_before_any_estimate_the_blocked_time_counts_as_transfer():
    assert split_step(step_s=0.1, comm_s=0.03).comm_transfer == 0.03
    assert split_step(step_s=0.1, comm_s=0.03, transfer_s=0.05).comm_wait == 0.0  # less than the estimate


def test_transfer_is_the_least_blocked_rank():
    assert transfer_estimate([0.043, 0.0021, None, math.nan]) == 0.0021
    assert transfer_estimate([None, None]) is None


def _window(rows):
    """A window as StepTimer rows: (work mean, data, blocked comm, other, compute) per rank, no vitals."""
    nan = math.nan
    return skew_report(1, 20, [[work, nan, nan, nan, nan, nan, data, comm, other, compute]
                               for work, data, comm, other, compute in rows])


# Recorded: tests/examples/plain_loop.py under `npudist launch --nproc-per-node 2`, rank 1 sleeping 40 ms a
# batch in its Dataset; means per step of the second window (steps 21-40), seconds.
RANK1_SLOW_DATA = [(0.0049, 0.0003, 0.0431, 0.0006, 0.0040), (0.0447, 0.0406, 0.0019, 0.0005, 0.0036)]


def test_the_rank_that_waited_least_is_named_with_the_phase_that_explains_the_gap():
    phases = window_phases(_window(RANK1_SLOW_DATA))
    assert phases[0].comm_transfer == pytest.approx(0.0019) and phases[0].comm_wait == pytest.approx(0.0412)
    assert phases[1].comm_wait == 0.0
    c = culprit(phases)
    assert c.rank == 1 and c.cause == "data"
    assert c.gap_s == pytest.approx(0.0412) and c.excess == pytest.approx(0.0403)
    assert c.text() == "rank 1: data +40 ms per step"
    assert c.others_wait_ratio > 0.8 and wait_ratio(phases[1]) == 0.0


def test_compute_is_named_when_a_busy_rank_makes_the_others_wait():
    # Issue #44's 200 ms busy wait in rank 2's forward: every rank's backward looks the same, only the
    # others' wait and rank 2's compute show it.
    rows = [(0.09, 0.001, 0.203, 0.001, 0.089), (0.09, 0.001, 0.201, 0.001, 0.089),
            (0.29, 0.001, 0.002, 0.001, 0.290), (0.09, 0.001, 0.204, 0.001, 0.089)]
    c = culprit(window_phases(_window(rows)))
    assert (c.rank, c.cause) == (2, "compute") and c.excess == pytest.approx(0.201)


def test_no_cause_when_no_single_phase_explains_most_of_the_gap():
    # Rank 1 is 40 ms late: 15 ms more data, 15 ms more compute, 10 ms more other; none explains most of it.
    rows = [(0.05, 0.001, 0.042, 0.001, 0.05), (0.09, 0.016, 0.002, 0.011, 0.065)]
    c = culprit(window_phases(_window(rows)))
    assert c.rank == 1 and c.cause is None and c.gap_s == pytest.approx(0.040)
    assert c.text() == "rank 1: +40 ms per step, no single phase explains it"


def test_no_culprit_without_a_gap_or_without_two_ranks():
    even = [(0.05, 0.001, 0.002, 0.001, 0.05), (0.05, 0.001, 0.002, 0.001, 0.05)]
    assert culprit(window_phases(_window(even))) is None
    assert culprit(window_phases(_window(RANK1_SLOW_DATA[:1]))) is None
    old_rows = skew_report(1, 20, [[0.05, math.nan, math.nan, math.nan, math.nan, math.nan, 0.0, 0.01]] * 2)
    assert window_phases(old_rows) == [None, None]  # rows from a rank without phase columns
