"""The one histogram accumulator (npudist.runtime.histogram), as the recorder, writer and exporters use it."""

from __future__ import annotations

import math
import threading

import pytest

from npudist.runtime.histogram import Buckets, Histogram


def test_a_value_on_a_bound_counts_in_that_bucket_and_the_snapshot_is_cumulative():
    h = Histogram((0.1, 1.0, math.inf))
    for value in (0.05, 0.1, 0.5, 7.0):
        h.observe(value)
    assert h.snapshot() == Buckets(((0.1, 2), (1.0, 3), (math.inf, 4)), pytest.approx(7.65), 4)


@pytest.mark.parametrize("bounds", [(), (1.0, 0.5, math.inf), (0.5, 1.0)])
def test_bounds_must_ascend_and_end_with_inf(bounds):
    with pytest.raises(ValueError, match="ascend and end with inf"):
        Histogram(bounds)


def test_clear_empties_in_place_so_a_held_reference_sees_it():
    h = Histogram((1.0, math.inf))
    counts = h.counts
    h.observe(3.0)
    h.clear()
    assert counts == [0, 0] and h.snapshot() == Buckets(((1.0, 0), (math.inf, 0)), 0.0, 0)


def test_a_shared_histogram_loses_no_observation_across_threads():
    h = Histogram((0.5, math.inf), shared=True)

    def observe() -> None:
        for _ in range(20_000):
            h.observe(1.0)

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = h.snapshot()
    assert (snap.count, snap.sum) == (80_000, 80_000.0)


def test_the_three_users_share_the_one_accumulator():
    from npudist.checkpoint.writer import CheckpointWriter
    from npudist.comm.recorder import Recorder
    from npudist.telemetry.job.histogram import Histogram as LoopHistogram

    recorder = Recorder()
    recorder.record("all_reduce", "gloo", 8, 2e-3)
    assert isinstance(recorder.counter("all_reduce", "gloo").durations, Histogram)
    assert isinstance(CheckpointWriter()._write, Histogram)
    assert issubclass(LoopHistogram, Histogram)
    loop = LoopHistogram((1.0, math.inf))
    loop.observe(0.25)
    assert loop.buckets() == ([("1.0", 1.0), ("+Inf", 1.0)], 0.25, 1)
