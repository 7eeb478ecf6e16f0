"""StragglerDetector on seeded synthetic traces: every rank 1.0 s x 5 % lognormal noise per window.

The seeds here (9xxxx) are not the ones the settings were tuned on (benchmarks/scale_sim.py uses 2020;
tuning runs used seeds below 100).
"""

import math

import numpy as np
import pytest

from npudist.diagnosis.straggler.detector import leave_one_out_median, t_quantile, t_tail
from npudist.telemetry import StragglerDetector

NOISE = 0.05


def _trace(rng, n, windows, slow=None, factor=lambda k: 1.3, onset=0):
    means = np.exp(rng.normal(0.0, NOISE, (windows, n)))
    if slow is not None:
        for w in range(onset, windows):
            means[w, slow] *= factor(w - onset)
    return means


def _warmup(n):
    return 1 + math.ceil(200 / (n - 1))  # ~200 noise samples before the onset, as the harness does


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10])
def test_leave_one_out_median_matches_the_definition(n):
    rng = np.random.default_rng(90001 + n)
    for _ in range(20):
        v = rng.normal(size=n)
        v[rng.random(n) < 0.2] = np.nan
        got = leave_one_out_median(v)
        for i in range(n):
            others = [v[j] for j in range(n) if j != i and np.isfinite(v[j])]
            want = np.median(others) if np.isfinite(v[i]) and others else np.nan
            assert (np.isnan(got[i]) and np.isnan(want)) or got[i] == pytest.approx(want)


def test_student_t_tail_and_quantile():
    assert t_tail(2.0, 1) == pytest.approx(0.5 - math.atan(2.0) / math.pi, rel=1e-9)  # Cauchy
    assert t_tail(1.959964, 1e6) == pytest.approx(0.025, rel=1e-4)  # normal limit
    for nu in (2, 7, 40):
        assert t_tail(t_quantile(1e-6, nu), nu) == pytest.approx(1e-6, rel=1e-6)


@pytest.mark.parametrize(("n", "trials", "least"), [
    (2, 10, 0.8), (8, 20, 0.95), (64, 40, 0.95),
    pytest.param(1024, 30, 0.95, marks=pytest.mark.slow), pytest.param(8192, 12, 1.0, marks=pytest.mark.slow)])
def test_a_rank_1_3x_slower_is_flagged_within_3_windows(n, trials, least):
    rng = np.random.default_rng(91000 + n)
    onset, hits, others = _warmup(n), 0, 0
    for _ in range(trials):
        slow = int(rng.integers(n))
        det = StragglerDetector(n)
        flags = [det.update(m) for m in _trace(rng, n, onset + 3, slow, onset=onset)]
        hits += any(slow in f for f in flags[onset:])
        others += sum(any(r != slow for r in f) for f in flags)
    assert hits >= least * trials, f"{hits}/{trials} detected within 3 windows at N={n}"
    assert others == 0


def _short_history(n, trials, seed):
    """Fraction of trials in which a fresh detector flags the 1.3x rank within 3 windows of its onset after
    10 windows without it (issue #32 measured the old detector: 1/40 at 2 ranks, 30/40 at 4), and the windows
    in which another rank was flagged."""
    rng = np.random.default_rng(seed)
    hits = others = 0
    for _ in range(trials):
        slow = int(rng.integers(n))
        det = StragglerDetector(n)
        flags = [det.update(m) for m in _trace(rng, n, 13, slow, onset=10)]
        hits += any(slow in f for f in flags[10:])
        others += sum(any(r != slow for r in f) for f in flags)
    return hits / trials, others


def test_a_1_3x_rank_among_4_is_flagged_within_3_windows_from_a_10_window_history():
    """The others' spread in every window is noise known at once: >= 95 % (the replay: 99.9 %)."""
    rate, others = _short_history(4, 60, 95004)
    assert rate >= 0.95 and others == 0, (rate, others)


def test_2_ranks_come_close_to_the_best_any_rule_can_do_from_a_10_window_history():
    """No scale-invariant rule flags more than 75.3 % within 3 windows at 1e-4 false windows per window
    (benchmarks/straggler_bound.py, docs/engineering/straggler.md); the replay gives about 66 %, the old
    detector 2.5 %."""
    rate, others = _short_history(2, 80, 95002)
    assert rate >= 0.55 and others == 0, (rate, others)


def test_2_ranks_flag_a_rank_slow_from_the_first_window():
    """Its own past looks like noise to the onset test; the window-to-window changes do not move."""
    rng = np.random.default_rng(95005)
    det = StragglerDetector(2)
    flags = [det.update(m) for m in _trace(rng, 2, 30, 1, lambda k: 1.5)]
    first = flags.index([1])  # the changes' noise needs about 10 windows at 2 ranks
    assert [0] not in flags and first <= 20 and all(f == [1] for f in flags[first:]), flags


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_a_long_null_replay_holds_the_false_window_target(n):
    """50,000 windows without a slow rank: 1 flagged window per 10,000 is 5 expected; more than 10 happens in
    1.4 % of runs at the target and in most runs of a rule at twice it."""
    rng = np.random.default_rng(96000 + n)
    det = StragglerDetector(n)
    flagged = sum(bool(det.update(m)) for m in _trace(rng, n, 50000))
    assert flagged <= 10, flagged


@pytest.mark.parametrize(("n", "windows"), [(2, 4000), (16, 3000), pytest.param(512, 1000, marks=pytest.mark.slow),
                                             pytest.param(8192, 150, marks=pytest.mark.slow)])
def test_a_a_runs_flag_at_most_one_window_in_10000(n, windows):
    rng = np.random.default_rng(92000 + n)
    det = StragglerDetector(n)
    flagged = sum(bool(det.update(m)) for m in _trace(rng, n, windows))
    assert flagged <= max(0, windows // 10000), f"{flagged} flagged windows of {windows} at N={n}"


def test_ramp_is_flagged_once_it_is_large_and_never_below_min_slowdown():
    rng = np.random.default_rng(93001)
    n, onset = 64, 5
    ramp = lambda k: min(1.5, 1.0 + 0.03 * (k + 1))  # noqa: E731 - thermal throttling, 3 % per window
    for _ in range(10):
        det = StragglerDetector(n)
        first = None
        for w, m in enumerate(_trace(rng, n, onset + 25, 7, ramp, onset)):
            if 7 in det.update(m) and first is None:
                first = w - onset
        assert first is not None and ramp(first) >= 1.1 and ramp(first) <= 1.35, first


def test_intermittent_slowness_is_flagged_in_slow_windows_and_mostly_released_in_normal_ones():
    rng = np.random.default_rng(93002)
    n, onset = 256, 3
    burst = lambda k: 1.5 if k % 4 == 0 else 1.0  # noqa: E731
    det = StragglerDetector(n)
    slow_flagged = carried = others = 0
    for w, m in enumerate(_trace(rng, n, onset + 40, 3, burst, onset)):
        f = det.update(m)
        others += any(r != 3 for r in f)
        if w >= onset and burst(w - onset) > 1:
            slow_flagged += 3 in f
        else:
            carried += 3 in f  # a normal window right after a burst that is itself a little slow
    assert slow_flagged >= 9 and carried <= 3 and others == 0  # 10 slow windows, 30 normal ones


def test_a_rank_that_sent_nothing_is_neither_flagged_nor_a_reference():
    rng = np.random.default_rng(93003)
    det = StragglerDetector(8)
    for w, m in enumerate(_trace(rng, 8, 40, 2, onset=20)):
        m[5] = np.nan if w % 3 == 0 else m[5]
        m[6] = np.nan
        f = det.update(m)
        assert 5 not in f and 6 not in f and (w < 20 or math.isnan(det.ratios[6]))
    assert f == [2] and det.ratios[2] == pytest.approx(1.3, rel=0.15)


def test_a_single_rank_or_identical_timings_never_flag():
    det = StragglerDetector(1)
    assert all(det.update([0.1]) == [] for _ in range(10))
    det = StragglerDetector(4)
    assert all(det.update([0.1] * 4) == [] for _ in range(10))
    assert det.noise == det.settings.noise_floor  # identical timings: the floor, not zero


def test_a_gross_straggler_is_named_before_the_noise_is_well_known():
    det = StragglerDetector(4)
    rng = np.random.default_rng(93004)
    flags = [det.update(m) for m in _trace(rng, 4, 8, 1, lambda k: 3.0)]
    assert [1] in flags[:5]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"false_rate": 0}, "false_rate"), ({"max_windows": 0}, "max_windows"), ({"min_slowdown": 0.9}, "min_slowdown"),
    ({"noise_floor": 0}, "noise_floor"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StragglerDetector(4, **kwargs)
    with pytest.raises(ValueError, match="world_size"):
        StragglerDetector(0)
    with pytest.raises(ValueError, match="expected 4"):
        StragglerDetector(4).update([1.0, 2.0])
