"""Straggler diagnosis: counted in exchange windows, written once per streak, with the slow rank's vitals."""

import json
import re

import pytest

from npudist.telemetry.job.skew import skew_report
from npudist.telemetry.job.step_timer import StepTimer, TrainingMetrics
from npudist.telemetry.job.straggler import StragglerDiagnosis, diagnosis
from tests.conftest import run_npudist


def _report(first, last, means, temp=(None, 71.0), freq=(None, 1.2e9), util=(None, 0.35), npu=(None, 2),
            chip=(None, 1)):
    rows = [[m, *(float("nan") if v is None else v for v in (temp[i], freq[i], util[i], npu[i], chip[i]))]
            for i, m in enumerate(means)]
    return skew_report(first, last, rows)


def test_fourth_column_is_utilization():
    r = _report(1, 5, [0.02, 0.08])
    assert r.straggler == 1 and r.utilizations == (None, 0.35) and r.temperatures == (None, 71.0)
    assert abs(r.skew - 0.6) < 1e-12  # pstdev(0.02, 0.08) = 0.03, mean 0.05


def test_written_after_n_skewed_windows_in_a_row_and_once_per_streak(tmp_path):
    diag = StragglerDiagnosis(tmp_path, windows=2)
    assert diag(_report(1, 5, [0.02, 0.08])) is None  # one window is not yet a streak
    assert diag(_report(6, 10, [0.05, 0.05])) is None  # below threshold: the streak restarts
    assert diag(_report(11, 15, [0.02, 0.08])) is None
    path = diag(_report(16, 20, [0.02, 0.09]))
    assert path == tmp_path / "straggler-step00000020.json"
    doc = json.loads(path.read_text())
    assert doc["straggler_rank"] == 1 and doc["steps"] == [11, 20]
    assert doc["straggler_step_seconds"] == [0.08, 0.09]
    assert doc["device"] == {"npu_id": 2, "chip_id": 1, "temperature_celsius": 71.0, "frequency_hertz": 1.2e9,
                             "utilization_ratio": 0.35}
    assert diag(_report(21, 25, [0.02, 0.09])) is None  # same streak: nothing new
    assert len(list(tmp_path.glob("straggler-*.json"))) == 1


def test_diagnosis_document_numbers():
    doc = diagnosis([_report(1, 5, [0.01, 0.03])], 0.12)
    assert doc["mean_step_seconds_all_ranks"] == pytest.approx(0.02) and doc["slowdown_ratio"] == pytest.approx(1.5)


def test_the_straggler_is_named_by_its_card_and_chip_where_its_rank_knows_them():
    from npudist.telemetry.job.skew import describe

    located, unknown = _report(1, 5, [0.01, 0.03]), _report(1, 5, [0.03, 0.01])  # rank 0 did not find its chip
    assert located.devices == (None, (2, 1)) and "rank 1 (device 2 chip 1) is slowest" in describe(located, 0.12)
    assert "rank 0 is slowest" in describe(unknown, 0.12)
    assert diagnosis([unknown], 0.12)["device"]["npu_id"] is None
    four_columns = skew_report(1, 5, [[0.01, 71.0, 1e9, 0.5], [0.03, 70.0, 1e9, 0.5]])  # a rank row without ids
    assert four_columns.devices == (None, None)


def test_time_waiting_in_collectives_is_not_work():
    now = [0.0]
    timer = StepTimer(TrainingMetrics(), exchange_every=0, clock=lambda: now[0])
    timer.step()
    now[0] = 0.10
    timer.add_wait(0.07)  # this rank waited 70 ms for a slower peer in the first step
    timer.step()
    now[0] = 0.20  # two steps of 0.1 s wall time each
    timer.step()
    assert timer._window == pytest.approx([0.03, 0.10])


@pytest.mark.slow
def test_example_names_the_slowed_rank(tmp_path):
    done = run_npudist(["launch", "--nproc-per-node", "2", "examples/train_ddp.py", "--steps", "30", "--run-dir",
                        str(tmp_path), "--straggler-diagnosis", "2", "--exchange-every", "5", "--slow-rank", "1",
                        "--slow-ms", "60"], timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(tmp_path.glob("straggler-step*.json"))
    assert files, done.stderr[-3000:]
    doc = json.loads(files[0].read_text())
    assert doc["straggler_rank"] == 1 and all(s >= 0.06 for s in doc["straggler_step_seconds"])
    assert re.search(r"rank 1 is slowest", done.stderr)
