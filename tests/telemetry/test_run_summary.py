"""The end-of-run summary says when straggler diagnosis files were off, instead of a "none" that reads as
"no straggler"."""

from npudist.telemetry.job.run_summary import RunSummary


def test_diagnoses_off_says_how_to_turn_them_on_and_none_means_none(tmp_path):
    off = RunSummary().lines(tmp_path, diagnosing=False)[1]
    assert off.startswith("straggler diagnoses: off") and "--straggler-diagnosis WINDOWS" in off
    assert RunSummary().lines(tmp_path)[1] == "straggler diagnoses: none"
    (tmp_path / "straggler-step00000020.json").write_text("{}")
    assert RunSummary().lines(tmp_path, diagnosing=False)[1] == \
        f"straggler diagnoses: {tmp_path / 'straggler-step00000020.json'}"
