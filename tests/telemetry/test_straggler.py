"""Straggler verdicts: cause class, one document per streak, the slow rank named by its card."""

import dataclasses
import json
import re
import time

import pytest

from npudist.diagnosis.straggler.skew import skew_report
from npudist.telemetry.job.step_timer import StepTimer, TrainingMetrics
from npudist.telemetry.job.straggler import StragglerDiagnosis, StragglerWarnings, cause, describe_flag, diagnosis
from tests.conftest import run_npudist


def _report(first, last, means, flagged=(), temp=(None, 71.0), freq=(None, 1.2e9), util=(None, 0.35),
            npu=(None, 2), chip=(None, 1), data=None, comm=None):
    n = len(means)
    pad = lambda t: tuple(t) + (None,) * (n - len(t))  # noqa: E731
    data, comm = data or (0.0,) * n, comm or (0.0,) * n
    rows = [[m, *(float("nan") if v is None else v
                  for v in (pad(temp)[i], pad(freq)[i], pad(util)[i], pad(npu)[i], pad(chip)[i])), data[i], comm[i]]
            for i, m in enumerate(means)]
    r = skew_report(first, last, rows)
    ratios = tuple(m / sorted(means[:i] + means[i + 1:])[len(means) // 2 - 1] for i, m in enumerate(means))
    return dataclasses.replace(r, flagged=tuple(flagged), ratios=ratios)


def test_fourth_column_is_utilization():
    r = _report(1, 5, [0.02, 0.08])
    assert r.straggler == 1 and r.utilizations == (None, 0.35) and r.temperatures == (None, 71.0)
    assert abs(r.skew - 0.6) < 1e-12  # pstdev(0.02, 0.08) = 0.03, mean 0.05


@pytest.mark.parametrize(("data", "comm", "expected"), [
    ((0.001, 0.001, 0.001, 0.001), (0.05, 0.05, 0.0, 0.05), "compute"),  # slow rank 2 waits least in comm
    ((0.001, 0.001, 0.041, 0.001), (0.05, 0.05, 0.0, 0.05), "data"),  # its extra time is waiting for data
    ((0.001, 0.001, 0.001, 0.001), (0.01, 0.01, 0.09, 0.01), "communication"),
])
def test_cause_is_the_section_with_the_largest_excess(data, comm, expected):
    r = _report(1, 20, [0.1, 0.1, 0.15, 0.1], flagged=(2,), npu=(0, 1, 2, 3), chip=(0, 0, 0, 0), data=data,
                comm=comm)
    kind, excess = cause(r, 2)
    assert kind == expected, excess
    line = describe_flag(r, 2)
    assert f"cause: {expected}" in line and "rank 2 (device 2 chip 0) works 1.50x" in line


def test_cause_without_section_columns_is_compute():
    r = skew_report(1, 5, [[0.1], [0.3]])
    assert cause(r, 1) == ("compute", {"compute": pytest.approx(0.2), "communication": 0.0, "data": 0.0})


def test_written_after_n_flagged_windows_in_a_row_and_once_per_streak(tmp_path):
    diag = StragglerDiagnosis(tmp_path, windows=2)
    assert diag(_report(1, 5, [0.02, 0.08], flagged=(1,))) == []  # one window is not yet a streak
    assert diag(_report(6, 10, [0.05, 0.05])) == []  # not flagged: the streak restarts
    assert diag(_report(11, 15, [0.02, 0.08], flagged=(1,))) == []
    (path,) = diag(_report(16, 20, [0.02, 0.09], flagged=(1,)))
    assert path == tmp_path / "straggler-step00000020.json"
    doc = json.loads(path.read_text())
    assert doc["straggler_rank"] == 1 and doc["steps"] == [11, 20] and doc["cause"] == "compute"
    assert doc["straggler_step_seconds"] == [0.08, 0.09]
    assert doc["slowdown_ratios"] == [pytest.approx(4.0), pytest.approx(4.5)]
    assert doc["device"] == {"npu_id": 2, "chip_id": 1, "temperature_celsius": 71.0, "frequency_hertz": 1.2e9,
                             "utilization_ratio": 0.35}
    assert diag(_report(21, 25, [0.02, 0.09], flagged=(1,))) == []  # same streak: nothing new
    assert len(list(tmp_path.glob("straggler-*.json"))) == 1


def test_a_diagnosis_says_on_which_host_and_pid_the_straggler_runs(tmp_path):
    from npudist.diagnosis.place import Place

    asked = []

    def where(ranks):
        asked.append(ranks)
        return {1: Place(host="node7", pid=4242, local_rank=1, accelerator="npu")}

    report = _report(1, 5, [0.02, 0.08], flagged=(1,))  # rank 1 computes on card 2 chip 1, compute-bound
    (path,) = StragglerDiagnosis(tmp_path, where=where)(report)
    doc = json.loads(path.read_text())
    assert (doc["host"], doc["pid"]) == ("node7", 4242) and asked == [[1]]  # one lookup, for the flagged rank
    assert (doc["local_rank"], doc["accelerator"]) == (1, "npu") and doc["cause"] == "compute"
    assert doc["next_commands"] == ["npu-smi info -t health -i 2 -c 1 (on node7)"]  # its card, in Ascend's tool
    assert doc["where"] == "rank 1, local rank 1, on node7, pid 4242, card 2 chip 1"
    assert doc["iso_time"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(doc["time"]))
    (path,) = StragglerDiagnosis(tmp_path / "alone")(_report(1, 5, [0.02, 0.08], flagged=(1,)))
    alone = json.loads(path.read_text())
    assert alone["host"] is None and alone["next_commands"] == []  # outside a job: said so, not invented
    # The console line names the same place and the same next command, looked up once per new flag.
    warned = StragglerWarnings(where=where)
    (line,) = warned(report)
    assert "rank 1 (node7 pid 4242, device 2 chip 1) works" in line
    assert line.endswith("; next: npu-smi info -t health -i 2 -c 1 (on node7)")
    assert warned(report) == [] and asked == [[1], [1]]


def test_two_flagged_ranks_get_one_document_each(tmp_path):
    paths = StragglerDiagnosis(tmp_path)(_report(1, 5, [0.1, 0.2, 0.1, 0.2], flagged=(1, 3)))
    assert [p.name for p in paths] == ["straggler-step00000005-rank1.json", "straggler-step00000005-rank3.json"]


def test_the_straggler_is_named_by_its_card_and_chip_where_its_rank_knows_them():
    located = _report(1, 5, [0.01, 0.03], flagged=(1,))
    unknown = _report(1, 5, [0.03, 0.01], flagged=(0,))  # rank 0 did not find its chip
    assert located.devices == (None, (2, 1)) and "rank 1 (device 2 chip 1) works" in describe_flag(located, 1)
    assert "rank 0 works" in describe_flag(unknown, 0) and "temperature n/a" in describe_flag(unknown, 0)
    assert diagnosis([unknown], 0)["device"]["npu_id"] is None
    four_columns = skew_report(1, 5, [[0.01, 71.0, 1e9, 0.5], [0.03, 70.0, 1e9, 0.5]])  # a rank row without ids
    assert four_columns.devices == (None, None)


def test_time_waiting_in_collectives_is_not_work_and_data_wait_is():
    now = [0.0]
    timer = StepTimer(TrainingMetrics(), exchange_every=0, clock=lambda: now[0])
    timer.step()
    now[0] = 0.10
    timer.add_wait(0.07)  # this rank waited 70 ms for a slower peer in the first step
    timer.step()
    with timer.data_wait():
        now[0] = 0.13  # 30 ms waiting for the batch: the rank's own time
    now[0] = 0.20  # two steps of 0.1 s wall time each
    timer.step()
    assert timer._window == pytest.approx([0.03, 0.10])
    assert timer._window_data == pytest.approx(0.03) and timer._window_comm == pytest.approx(0.07)


@pytest.mark.e2e
@pytest.mark.slow
def test_example_names_the_slowed_rank_with_its_device(tmp_path):
    # 3 ranks, rank 1 three times slower (a sleep of twice its own step on top); an exchange every 4 steps.
    # A gross straggler, so the test holds on a loaded CI machine whose per-window noise is 10-25 %.
    done = run_npudist(["launch", "--nproc-per-node", "3", "examples/train_ddp.py", "--steps", "100",
                        "--run-dir", str(tmp_path), "--straggler-diagnosis", "1", "--exchange-every", "4",
                        "--global-batch-size", "24", "--slow-rank", "1", "--slow-factor", "3"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(tmp_path.glob("straggler-step*.json"))
    assert files, done.stderr[-3000:]
    doc = json.loads(files[0].read_text())
    assert doc["straggler_rank"] == 1 and doc["cause"] == "compute" and doc["slowdown_ratio"] > 1.1
    assert re.search(r"straggler: rank 1 .*works [\d.]+x the median", done.stderr)
    assert not re.search(r"straggler: rank [02] ", done.stderr)


@pytest.mark.parametrize("planted", ["straggler-step00000005.tmp", "straggler-step00000005.json"])
def test_links_planted_in_the_run_dir_are_not_written_through(tmp_path, planted):
    """Third audit: a co-tenant who can write the run directory plants a link at the temporary or the final
    name; the diagnosis must land in the run directory as a plain file and the link's target stay intact."""
    run_dir, victim = tmp_path / "run", tmp_path / "victim.txt"
    run_dir.mkdir()
    victim.write_text("precious")
    (run_dir / planted).symlink_to(victim)
    (path,) = StragglerDiagnosis(run_dir)(_report(1, 5, [0.02, 0.08], flagged=(1,)))
    assert victim.read_text() == "precious"
    assert path == run_dir / "straggler-step00000005.json" and not path.is_symlink()
    assert json.loads(path.read_text())["straggler_rank"] == 1
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def test_the_straggler_line_and_document_name_the_phase_when_the_flagged_rank_is_the_one_waited_for():
    nan = float("nan")
    rows = [[0.0049, nan, nan, nan, 0.0, 0.0, 0.0003, 0.0431, 0.0006, 0.0040],
            [0.0447, nan, nan, nan, 1.0, 0.0, 0.0406, 0.0019, 0.0005, 0.0036]]
    r = dataclasses.replace(skew_report(21, 40, rows), flagged=(1,), ratios=(0.11, 9.1))
    line = describe_flag(r, 1)
    assert "cause: data" in line and "; phases: rank 1: data +40 ms per step; " in line, line
    doc = diagnosis([r], 1)
    assert doc["phases"]["culprit"]["rank"] == 1 and doc["phases"]["culprit"]["cause"] == "data"
    assert doc["phases"]["per_rank_seconds"][0]["comm_wait"] > 0.04
    # rank 0 is not the one the others waited for: its line (were it flagged) names no phase
    assert "phases:" not in describe_flag(dataclasses.replace(r, flagged=(0,)), 0)
