"""The end-of-run summary's straggler line (RunSummary), fed hand-made windows."""

import re
from dataclasses import replace

import numpy as np

from npudist.diagnosis.straggler.skew import skew_report
from npudist.telemetry.job.run_summary import RunSummary


def _window(i, means, flagged=()):
    report = skew_report(20 * i + 1, 20 * (i + 1), [[m] for m in means])
    others = [np.median([m for j, m in enumerate(means) if j != r]) for r in range(len(means))]
    return replace(report, ratios=tuple(m / o for m, o in zip(means, others, strict=True)), flagged=tuple(flagged))


def test_a_rank_slowest_in_every_window_but_never_flagged_gets_its_line():
    """Seen on a loaded 2-core host: rank 1 at 1.2-1.9x in 14 of 14 windows, none crossing the threshold."""
    summary = RunSummary()
    for i, slow in enumerate([1.2, 1.9, 1.4, 1.3, 1.5, 1.25, 1.6, 1.2, 1.8, 1.3, 1.4, 1.35, 1.5, 1.45]):
        summary(_window(i, [1.0, slow]))
    line = summary.skew_line()
    assert line.startswith("straggler: no rank flagged in 14 windows")
    m = re.search(r"; rank 1 was the slowest in 14 of 14 windows \(median ([\d.]+)x the median of the others\), "
                  r"below the flag threshold$", line)
    assert m is not None and float(m.group(1)) == 1.4, line


def test_no_such_line_when_the_slowest_rank_changes_as_chance_makes_it():
    rng = np.random.default_rng(94001)
    summary = RunSummary()
    for i in range(30):
        summary(_window(i, list(np.exp(rng.normal(0, 0.05, 4)))))
    assert summary.skew_line().endswith(")") and "was the slowest" not in summary.skew_line()


def test_a_short_run_does_not_name_a_rank_that_chance_made_slowest():
    summary = RunSummary()
    for i in range(5):  # 5 of 5 at 2 ranks happens in 1 run in 16 without a straggler
        summary(_window(i, [1.0, 1.1]))
    assert "was the slowest" not in summary.skew_line()


def test_a_flagged_rank_keeps_the_flagged_line():
    summary = RunSummary()
    for i in range(12):
        summary(_window(i, [1.0, 1.0, 1.0, 1.5], flagged=(3,) if i > 8 else ()))
    assert summary.skew_line().startswith("straggler: rank 3 flagged in 3 of 12 windows, at 1.50x (steps ")


def test_diagnoses_off_says_how_to_turn_them_on_and_none_means_none(tmp_path):
    off = RunSummary().lines(tmp_path, diagnosing=False)[1]
    assert off.startswith("straggler diagnoses: off") and "--straggler-diagnosis WINDOWS" in off
    assert RunSummary().lines(tmp_path)[1] == "straggler diagnoses: none"
    (tmp_path / "straggler-step00000020.json").write_text("{}")
    assert RunSummary().lines(tmp_path, diagnosing=False)[1] == \
        f"straggler diagnoses: {tmp_path / 'straggler-step00000020.json'}"


def test_the_summary_gives_the_consoles_number_beside_the_worst_each_with_its_window():
    """The console named the straggler at its first flagged window and the summary only its worst: the same
    2-rank straggler showed two slowdowns with nothing saying they were different windows."""
    summary = RunSummary()
    for i, slow in enumerate([1.0, 1.3, 1.6, 1.4]):
        summary(_window(i, [1.0, slow], flagged=(1,) if slow > 1 else ()))
    line = summary.skew_line()
    assert "rank 1 flagged in 3 of 4 windows, at 1.30x when first flagged (steps " in line
    assert "the console's line), 1.60x at worst (steps " in line and "worst of all" not in line
