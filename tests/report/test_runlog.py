import json
import math

import pytest

from npudist.comm.recorder import Recorder
from npudist.telemetry.job.run_log import RunLog, device_record, rank_file
from npudist.telemetry.job.step_timer import StepTimer, TrainingMetrics
from npudist.telemetry.sources.readings import DeviceReading, RankDevice


class Ticker:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_steps_device_skew_and_comm_totals(tmp_path):
    recorder, wall, mono = Recorder(), Ticker(1000.0), Ticker(5.0)
    recorder.record("all_reduce", "gloo", 400, 0.5)  # before the log opened: not this run's
    reading = DeviceReading("npu", 0, power_watts=90.0, temperature_celsius=math.nan)
    path = rank_file(tmp_path, 1)
    runlog = RunLog(path, 1, readings=lambda: reading, comm_stats=recorder.snapshot, clock=wall, monotonic=mono)
    runlog.start(world=2, accelerator="npu", backend="hccl", start_step=0)
    runlog.step(1, 3.5, 0.25)
    runlog.step(2, float("inf"), None)  # same reading again: no second device record
    clock = Ticker(0.0)
    timer = StepTimer(TrainingMetrics(), exchange_every=2, clock=clock)
    runlog.attach(timer)
    for _ in range(3):
        timer.step()
        clock.now += 0.125
    recorder.record("all_reduce", "gloo", 1000, 1.5)
    recorder.record("all_reduce", "gloo", 1000, 0.5)
    mono.now = 13.0
    runlog.close()
    runlog.close()  # twice is harmless
    lines = _lines(path)
    assert [r["kind"] for r in lines] == ["start", "step", "device", "step", "skew", "comm"]
    assert all(r["rank"] == 1 and r["time"] == 1000.0 for r in lines)
    assert (lines[1]["loss"], lines[1]["step_seconds"]) == (3.5, 0.25)
    assert (lines[3]["loss"], lines[3]["step_seconds"]) == (None, None)  # inf and None: not recorded
    assert (lines[2]["power_watts"], lines[2]["temperature_celsius"]) == (90.0, None)
    assert {k: lines[4][k] for k in ("first_step", "last_step", "skew", "straggler", "means")} == {
        "first_step": 1, "last_step": 2, "skew": 0.0, "straggler": 0, "means": [0.125]}
    assert lines[5]["wall_seconds"] == 8.0
    assert lines[5]["ops"] == [{"op": "all_reduce", "backend": "gloo", "calls": 2, "bytes": 2000, "seconds": 2.0}]


@pytest.mark.subprocess
def test_a_resumed_run_appends(tmp_path):
    path = rank_file(tmp_path, 0)
    for start in (0, 10):
        runlog = RunLog(path, 0, comm_stats=None)
        runlog.start(world=1, accelerator="cpu", backend="gloo", start_step=start)
        runlog.close()
    assert [r["start_step"] for r in _lines(path)] == [0, 10]


def test_a_failing_write_never_stops_training(tmp_path, caplog):
    runlog = RunLog(rank_file(tmp_path, 0), 0, comm_stats=None)
    class Broken:
        def write(self, _):
            raise OSError(28, "No space left on device")

        def flush(self):
            pass

        def close(self):
            pass

    runlog._file = Broken()
    runlog.step(2, 1.0, 1.0)
    runlog.step(3, 1.0, 1.0)
    assert caplog.text.count("No space left on device") == 1


def test_device_record_without_any_value_is_dropped():
    assert device_record(DeviceReading("cpu", 0)) is None
    assert device_record(DeviceReading("cpu", 0, utilization_ratio=0.5))["utilization_ratio"] == 0.5


@pytest.mark.subprocess
def test_every_record_the_writer_writes_is_one_the_report_reads(tmp_path):
    from npudist.telemetry import runlog_schema as schema

    recorder = Recorder()
    reading = DeviceReading("npu", 4, power_watts=90.0, utilization_ratio=0.5, memory_used_bytes=2**30)
    runlog = RunLog(rank_file(tmp_path, 0), 0, readings=lambda: reading, comm_stats=recorder.snapshot)
    runlog.start(world=2, accelerator="npu", backend="hccl", start_step=0, device=RankDevice(2, 1, 5))
    timer = StepTimer(TrainingMetrics(), exchange_every=1, clock=Ticker(0.0))
    runlog.attach(timer)
    timer.step()
    timer.step()
    runlog.step(1, 2.5, 0.125)
    runlog.scalars(1, {"lr": 3e-4, "grad_norm": float("inf")})  # a non-finite value is written as null
    recorder.record("all_reduce", "gloo", 64, 0.01)
    runlog.close()
    lines = _lines(rank_file(tmp_path, 0))
    assert {r["kind"] for r in lines} == set(schema.KINDS)
    assert [r["values"] for r in lines if r["kind"] == "scalars"] == [{"lr": 3e-4, "grad_norm": None}]
    assert (lines[0]["npu_id"], lines[0]["chip_id"]) == (2, 1)
    for line in lines:
        checked = schema.check(line)
        assert checked["v"] == schema.VERSION
        assert {k: v for k, v in line.items() if k in checked} == {k: v for k, v in checked.items() if k in line}


def test_docs_table_is_generated_from_the_schema():
    from npudist.telemetry import runlog_schema as schema
    from tests.conftest import REPO

    text = (REPO / "docs" / "reference" / "report.md").read_text()
    table = text.split("<!-- runlog-table:begin -->\n", 1)[1].split("<!-- runlog-table:end -->", 1)[0]
    assert table == schema.markdown_table(), "regenerate with: python -m npudist.telemetry.runlog_schema"
