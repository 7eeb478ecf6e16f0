"""A real run must not resume silently from a checkpoint the simulated NPU wrote (third audit)."""

import json

import pytest
import torch

from npudist import checkpoint
from npudist.checkpoint.layout import step_dir_name

SIM = "NPUDIST_SIMULATE"


@pytest.fixture(autouse=True)
def _no_simulating_runtime_left():
    """A save starts this process's Runtime with the settings of the moment; one started under
    NPUDIST_SIMULATE would make a later test's accelerator the simulated NPU (installed in-process)."""
    from npudist.runtime import state

    before = state.peek()
    yield
    rt = state.peek()
    if rt is not None and rt is not before:
        rt.close()


def _save(root, step, monkeypatch, mode):
    if mode:
        monkeypatch.setenv(SIM, mode)
    else:
        monkeypatch.delenv(SIM, raising=False)
    checkpoint.save({"w": torch.full((2,), float(step))}, root, step)


def test_a_real_run_refuses_a_simulated_checkpoint_and_says_how_to_go_on(tmp_path, monkeypatch):
    _save(tmp_path, 10, monkeypatch, "npu:strict")
    assert json.loads((tmp_path / step_dir_name(10) / "manifest.json").read_text())["simulated"] == "npu:strict"
    monkeypatch.delenv(SIM)
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.load_latest(tmp_path)
    text = str(err.value)
    assert "written by a simulated NPU run (NPUDIST_SIMULATE=npu:strict)" in text and "its own run directory" in text
    assert "--resume-simulated" in text
    assert (tmp_path / step_dir_name(10)).is_dir()  # nothing removed
    state, step = checkpoint.load_latest(tmp_path, allow_simulated=True)
    assert step == 10 and state["w"].tolist() == [10.0, 10.0]


def test_simulated_runs_resume_anything_and_real_checkpoints_carry_no_mark(tmp_path, monkeypatch):
    _save(tmp_path, 10, monkeypatch, None)
    assert "simulated" not in json.loads((tmp_path / step_dir_name(10) / "manifest.json").read_text())
    assert checkpoint.load_latest(tmp_path)[1] == 10
    _save(tmp_path, 20, monkeypatch, "npu")
    assert checkpoint.load_latest(tmp_path)[1] == 20  # still simulating: the rehearsal resumes as before


def test_a_real_checkpoint_newer_than_a_simulated_one_is_resumed(tmp_path, monkeypatch):
    _save(tmp_path, 10, monkeypatch, "npu")
    _save(tmp_path, 20, monkeypatch, None)
    assert checkpoint.load_latest(tmp_path)[1] == 20
