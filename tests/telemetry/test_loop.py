"""The watched loop (telemetry/job/loop.py, loop_hooks.py) on one process: step numbers, the progress
line's elapsed time and ETA, the batch and total hints, and the torch hooks, with an injected clock."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import dataloader as dl

from npudist.telemetry.job import loop_hooks
from npudist.telemetry.job.console import duration, interrupted_line, progress
from npudist.telemetry.job.loop import (
    LoopSettings,
    TrainingLoop,
    batch_size_of,
    line_due,
    optimizer_step_count,
    total_hint,
)
from npudist.telemetry.job.step_timer import StepTimer


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


CTX = SimpleNamespace(rank=0, world_size=2, is_main=True, accelerator=SimpleNamespace(name="cpu"), backend="gloo")


def _loop(clock: FakeClock, lines: list[str], **settings) -> TrainingLoop:
    return TrainingLoop(CTX, LoopSettings(**settings), write=lines.append, clock=clock, argv=["train.py"]).start()


def test_elapsed_counts_from_the_first_step_not_from_each_step():
    """The bug this replaces: the start time was taken again every step, so every line read elapsed=0s."""
    clock, lines = FakeClock(), []
    loop = _loop(clock, lines, total_steps=10, log_every=5, start_step=0)
    for _ in range(10):
        with loop.data_wait():
            clock.now += 0.5
        clock.now += 1.5  # 2 s a step
        loop.end_step()
    loop.finish()
    steps = [line for line in lines if line.startswith("step=")]
    assert [re.search(r"done=\S+ elapsed=\S+ eta=\S+", line).group(0) for line in steps] == [
        "done=1/10 elapsed=2s eta=18s", "done=5/10 elapsed=10s eta=10s", "done=10/10 elapsed=20s eta=0s"]


def test_a_resumed_loop_numbers_training_steps_and_extrapolates_only_its_own():
    clock, lines = FakeClock(), []
    loop = _loop(clock, lines, total_steps=100, log_every=10, start_step=60)
    for _ in range(10):
        clock.now += 3.0
        loop.end_step()
    loop.flush()
    assert loop.step == 70
    assert lines[-1].startswith("step=70 done=70/100 elapsed=30s eta=1m30s ")


def test_the_line_shows_the_logged_loss_of_its_own_step_and_leaves_unknowns_out():
    """A loop that logs after optimizer.step(): the line waits for the next step's batch, so it carries the
    loss of the step it names; a tensor is read only then."""
    clock, lines = FakeClock(), []
    loop = _loop(clock, lines, log_every=1, start_step=0)
    for value in (4.0, 3.0):
        with loop.data_wait():
            clock.now += 1.0
        loop.end_step()
        loop.log({"loss": torch.tensor(value)})
    loop.flush()
    assert [line.split(" done=")[0] for line in lines] == ["step=1 loss=4.0000", "step=2 loss=3.0000"]
    assert lines[0].endswith(" world=2 accelerator=cpu backend=gloo") and "eta=" not in lines[0]
    loop.log({"loss": float("nan")})
    clock.now += 1.0
    loop.end_step()
    loop.flush()
    assert lines[-1].startswith("step=3 done=3 ")  # a non-finite loss is not printed as one


def test_samples_per_second_from_the_batch_times_the_world():
    clock, lines = FakeClock(), []
    loop = _loop(clock, lines, log_every=2, start_step=0)
    for _ in range(2):
        loop.fetched((torch.zeros(8, 3), torch.zeros(8)), 0.0, clock.now)
        clock.now += 0.5
        loop.end_step()
    loop.flush()
    # 2 steps x 8 samples x 2 ranks in 1 s (the window starts at the first batch)
    assert "samples/s=32.0 " in lines[-1], lines


def test_only_the_first_optimizer_marks_steps_and_its_state_gives_the_resumed_step():
    clock, lines = FakeClock(), []
    model = torch.nn.Linear(2, 1)
    first = torch.optim.Adam(model.parameters())
    for _ in range(7):  # a run that reached step 7 and saved its optimizer
        model(torch.ones(1, 2)).sum().backward()
        first.step()
    resumed = torch.optim.Adam(model.parameters())
    resumed.load_state_dict(first.state_dict())
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = _loop(clock, lines, log_every=1)
    model(torch.ones(1, 2)).sum().backward()
    resumed.step()
    loop.optimizer_stepped(resumed)
    loop.optimizer_stepped(other)  # a second optimizer in the same step
    assert loop.step == 8 and loop.start_step == 7
    assert optimizer_step_count(torch.optim.SGD(model.parameters(), lr=0.1)) is None


def test_npudist_step_overrides_the_optimizer():
    loop = _loop(FakeClock(), [], start_step=0)
    loop.explicit_step()
    loop.optimizer_stepped(object())
    assert loop.step == 1


def test_a_resumed_timer_numbers_its_windows_by_training_step():
    clock = FakeClock()
    timer = StepTimer(exchange_every=20, clock=clock, start_step=260)
    timer.step()
    for _ in range(40):
        clock.now += 0.01
        timer.step()
    assert (timer.last_report.first_step, timer.last_report.last_step) == (281, 300)
    late = StepTimer(exchange_every=20, clock=clock)
    late.resume_at(263)  # resumed from a peer snapshot between two windows: the first window is short
    late.step()
    for _ in range(17):
        clock.now += 0.01
        late.step()
    assert (late.last_report.first_step, late.last_report.last_step) == (264, 280)
    with pytest.raises(ValueError, match="start_step"):
        StepTimer(start_step=-1)


def test_hooks_see_a_plain_dataloader_and_optimizer_and_leave_no_trace():
    clock, lines = FakeClock(), []
    loop = _loop(clock, lines, log_every=1)
    original = dl._BaseDataLoaderIter.__dict__["__next__"]
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.zeros(12, 3), torch.zeros(12, 1)), batch_size=4)
    uninstall = loop_hooks.install(loop, clock=clock)
    try:
        for x, y in loader:
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    finally:
        uninstall()
    loop.flush()
    assert loop.step == 3 and loop.loader_length == 3
    assert [line.split(" done=")[1].split(" ")[0] for line in lines] == ["1/3", "2/3", "3/3"]  # the loader's length
    assert dl._BaseDataLoaderIter.__dict__["__next__"] is original
    opt.step()
    assert loop.step == 3  # the optimizer hook is gone too


@pytest.mark.parametrize(("argv", "length", "total"), [
    (["t.py", "--steps", "500"], 10, 500),
    (["t.py", "--max-steps=40", "--epochs", "3"], 10, 40),
    (["t.py", "--epochs", "3"], 10, 30),
    (["t.py"], 10, 10),
    (["t.py", "--steps", "abc"], None, None),
    (["t.py", "--steps"], None, None),
])
def test_total_hint(argv, length, total):
    assert total_hint(argv, length) == total


@pytest.mark.parametrize(("batch", "size"), [
    (torch.zeros(5, 2), 5), ((torch.zeros(6, 1), torch.zeros(6)), 6), ({"input_ids": torch.zeros(7, 3)}, 7),
    ([[torch.zeros(2)]], 2), (torch.tensor(1.0), None), ("text", None), ([], None), ({}, None),
])
def test_batch_size_of(batch, size):
    assert batch_size_of(batch) == size


def test_line_cadence():
    assert [s for s in range(1, 31) if line_due(s, total=30, log_every=None, since_line_s=0)] == [1, 3, 6, 9, 12, 15,
                                                                                                     18, 21, 24, 27, 30]
    assert line_due(7, total=None, log_every=None, since_line_s=31) and not line_due(7, total=None, log_every=None,
                                                                                    since_line_s=5)


def test_console_formats():
    assert (duration(42.4), duration(185), duration(3720)) == ("42s", "3m05s", "1h02m")
    assert progress(5, 10, 0, 0.0, 10.0) == "done=5/10 elapsed=10s eta=10s"
    assert progress(5, 10, 5, 0.0, 10.0) == "done=5/10 elapsed=10s eta=?"
    assert progress(12, 10, 0, 0.0, 10.0) == "done=12 elapsed=10s"
    assert interrupted_line(7, None, resumable=False) == "interrupted at step 7; last checkpoint none"


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="total_steps=0"):
        LoopSettings(total_steps=0)
    with pytest.raises(TypeError, match=r"unknown setting.*totl_steps"):
        TrainingLoop(CTX).configure(totl_steps=3)


def test_logged_scalars_go_to_the_run_log_and_metrics_at_each_line():
    """npudist.log: the loss on the line and in the step record, the other names in a scalars record and in
    the rank's metrics; a name per step is refused rather than grown without bound."""
    clock, lines = FakeClock(), []
    loop = _loop(clock, lines, log_every=2, start_step=0)
    runlog = SimpleNamespace(steps=[], scalar_records=[])
    runlog.step = lambda step, loss, seconds, rate: runlog.steps.append((step, loss))
    runlog.scalars = lambda step, values: runlog.scalar_records.append((step, values))
    exported = []
    loop.runlog = runlog
    loop.telemetry = SimpleNamespace(training_progress=lambda **kw: None,
                                     progress=SimpleNamespace(report_scalars=exported.append))
    for step in (1, 2):
        clock.now += 1.0
        loop.end_step()
        loop.log({"loss": torch.tensor(5.0 - step), "lr": 0.1 * step})
    loop.flush()
    assert runlog.steps == [(1, 4.0), (2, 3.0)]
    assert runlog.scalar_records == [(1, {"lr": 0.1}), (2, {"lr": 0.2})]
    assert exported == [{"lr": 0.1}, {"lr": 0.2}]
    with pytest.raises(ValueError, match="at most 64 names"):
        for i in range(100):
            loop.log({f"m{i}": 1.0})
