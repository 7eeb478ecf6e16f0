"""TensorBoard event files (issue 44, item 6): a clear message naming what to install wherever the tensorboard
package is missing (launch refuses before any rank starts), and rank 0's numbers written at the line's steps."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from npudist.accelerators import BY_NAME, Accelerator
from npudist.launch import LaunchError, plan
from npudist.telemetry.job import tensorboard
from npudist.telemetry.job.loop import LoopSettings, TrainingLoop, make_parts
from npudist.telemetry.job.tensorboard import TensorBoardMissing, TensorBoardScalars


@pytest.fixture
def no_tensorboard(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))


def test_without_the_package_the_message_says_what_to_install(no_tensorboard, tmp_path):
    why = tensorboard.missing_message("tb")
    assert why is not None and "--tensorboard tb needs the tensorboard package" in why
    assert "pip install 'npudist[tensorboard]'" in why
    with pytest.raises(TensorBoardMissing, match="needs the tensorboard package"):
        TensorBoardScalars(str(tmp_path))
    assert not any(tmp_path.iterdir())


def test_launch_refuses_before_any_rank_starts(no_tensorboard):
    with pytest.raises(LaunchError, match=r"--tensorboard runs/tb needs the tensorboard package.*pip install"):
        plan(["--nproc-per-node", "2", "--tensorboard", "runs/tb", "train.py"], Accelerator(BY_NAME["cpu"]), {})


def test_launch_hands_the_ranks_the_directory(tmp_path):
    pytest.importorskip("tensorboard")
    the_plan = plan(["--nproc-per-node", "2", "--tensorboard", str(tmp_path / "tb"), "train.py"],
                    Accelerator(BY_NAME["cpu"]), {})
    assert the_plan.env_updates["NPUDIST_TENSORBOARD"] == str(tmp_path / "tb")
    assert "--tensorboard" not in the_plan.torchrun_argv


def _scalars(directory) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_rank_0_writes_the_lines_numbers_at_their_steps(tmp_path):
    pytest.importorskip("tensorboard")
    ctx = SimpleNamespace(rank=0, world_size=2, is_main=True, accelerator=SimpleNamespace(name="cpu"), backend="gloo")
    loop = TrainingLoop(ctx, LoopSettings(tensorboard=str(tmp_path), telemetry=False, log_every=2, start_step=0,
                                          samples_per_step=8), make_parts=make_parts, write=lambda _: None)
    loop.start()
    for step in range(1, 5):  # a loop that logs after optimizer.step(), which ends the step
        loop.end_step()
        loop.log({"loss": 1.0 / step, "lr": 0.1 * step, "grad_norm": float("nan")})
    loop.close()
    got = _scalars(tmp_path)
    assert [s for s, _ in got["loss"]] == [1, 2, 4]  # the first step, then every 2nd: the lines' steps
    assert got["loss"][1][1] == pytest.approx(0.5) and got["lr"][2][1] == pytest.approx(0.4)
    assert "grad_norm" not in got  # never finite: nothing to plot
    assert "samples_per_second" in got


def test_other_ranks_write_nothing(tmp_path):
    ctx = SimpleNamespace(rank=1, world_size=2, is_main=False, accelerator=SimpleNamespace(name="cpu"), backend="gloo")
    loop = TrainingLoop(ctx, LoopSettings(tensorboard=str(tmp_path / "tb"), telemetry=False), make_parts=make_parts)
    loop.start()
    assert loop.tensorboard is None and not (tmp_path / "tb").exists()
