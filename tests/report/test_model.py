import pytest

from npudist.report import build, load_run
from npudist.report.records import ReportError, parse_bench, parse_rank_lines
from tests.report.runs import write_run


def test_malformed_lines_are_counted_and_skipped(tmp_path):
    run = load_run(write_run(tmp_path, bad_lines=True))
    assert [(p.source, p.line) for p in run.problems] == [("metrics/rank0.jsonl", 3), ("metrics/rank0.jsonl", 4)]
    assert "not JSON" in run.problems[0].reason and "kind must be one of" in run.problems[1].reason
    assert len(run.records) == 10 + 3 and run.rank_files == 2


def test_rank_comes_from_the_file_name_not_the_line():
    records, problems = parse_rank_lines(['{"v": 1, "time": 1, "kind": "step", "step": 3, "rank": 9}', "", "[1]"],
                                         "metrics/rank4.jsonl", 4)
    assert [r["rank"] for r in records] == [4]
    assert [(p.line, p.reason.split(" (")[0]) for p in problems] == [(3, "not a run-log record")]


def test_step_without_integer_step_or_time_is_a_problem():
    _, problems = parse_rank_lines(['{"v": 1, "time": 1, "kind": "step", "step": "x"}', '{"v": 1, "kind": "comm"}',
                                    '{"time": 1, "kind": "step", "step": 1}'], "f", 0)
    assert [(p.line, p.reason) for p in problems] == [
        (1, "field 'step' must be a non-negative integer, got str"), (2, "field 'time' is missing (required)"),
        (3, "field 'v' is missing (required)")]


def test_bench_rows_without_numbers_are_problems():
    result, problems = parse_bench('{"meta": {}, "rows": [{"size_bytes": 8, "busbw_gbps": 1}, {"size_bytes": 0}]}',
                                   "bench/x.json")
    assert [r["size_bytes"] for r in result.rows] == [8]
    assert [p.reason for p in problems] == ["row 2 has no positive finite size_bytes and busbw_gbps"]
    result, problems = parse_bench("[]", "bench/y.json")
    assert result is None and "npudist bench collective --json" in problems[0].reason


def test_missing_run_dir_is_named(tmp_path):
    with pytest.raises(ReportError, match=r"nope.*does not exist.*--run-dir"):
        load_run(tmp_path / "nope")


def test_report_data_from_a_resumed_two_rank_run(tmp_path):
    data = build(load_run(write_run(tmp_path)))
    # rank 0: step 10 ran twice (resume); the second record (loss 1.5) wins
    assert [(s.name, s.points) for s in data.loss] == [
        ("rank 0", ((1.0, 4.0), (10.0, 1.5), (20.0, 1.0))), ("rank 1", ((1.0, 4.5),))]
    assert [s.points for s in data.step_time] == [((1.0, 0.5), (10.0, 0.2), (20.0, 0.2)), ((1.0, 0.7),)]
    assert [(w.first_step, w.last_step, w.skew, w.straggler) for w in data.skew] == [(1, 10, 0.2, 1)]
    # (3 + 1) collective seconds over (12 + 4) wall seconds
    (share,) = data.comm
    assert (share.rank, share.wall_seconds, share.collective_seconds, share.share) == (0, 16.0, 4.0, 0.25)
    assert share.ops == (("all_reduce", "gloo", 15, 6000, 4.0),)
    assert [s.points for s in data.bench] == [((1024.0, 0.5), (4096.0, 2.0))]
    # device x = seconds since the first record (t=1000); memory shown in GiB; temperature missing
    assert data.device["utilization_ratio"][0].points == ((2.0, 0.25),)
    assert data.device["memory_used_bytes"][0].points == ((2.0, 2.0),)
    assert "temperature_celsius" not in data.device
    summary = dict(data.summary)
    assert summary["last logged step"] == "20" and summary["run segments (starts incl. resumes)"] == "2"
    # rank 0 ran 1000-1012 and 2000-2003: 15 s, not the 1003 s from its first record to its last
    # and says it is a sum, beside the span the started/ended lines above it show
    assert dict(data.card)["duration"] == ("0m 15s running, summed over 2 segments (the pauses before resumes left "
                                           "out; 16m 43s from started to ended)")
    assert summary["world size"] == "2" and summary["accelerator"] == "cpu"


def test_empty_run_dir_builds_empty_data(tmp_path):
    data = build(load_run(tmp_path))
    assert (data.loss, data.skew, data.comm, data.bench, data.device) == ((), (), (), (), {})
    assert dict(data.summary)["ranks with a log"] == "none"


def test_summary_names_each_ranks_physical_device(tmp_path):
    import json

    root = write_run(tmp_path)
    with (root / "metrics" / "rank1.jsonl").open("a") as fh:
        fh.write(json.dumps({"v": 1, "time": 3000.0, "kind": "start", "world": 2, "start_step": 20, "npu_id": 2,
                             "chip_id": 1}) + "\n")
    summary = dict(build(load_run(root)).summary)
    assert summary["physical devices (npu-smi NPU ID, chip)"] == "rank 1: device 2 chip 1"
    assert dict(build(load_run(write_run(tmp_path / "b"))).summary)[
        "physical devices (npu-smi NPU ID, chip)"] == "not recorded"
