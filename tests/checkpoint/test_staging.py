"""Staging of device state for asynchronous saves: host buffers reused per layout, values as of save().

The device path is forced on the CPU by treating host tensors as device ones (the copy into reused buffers
is the same code); simulated NPU tensors take that path for real. The
reused-DefaultStager failure of torch 2.11-2.12 (issue 33: the second save on a GPU raised
``KeyError: <class 'type'>``) is a second stage into the same stager; these tests stage twice and more, on
every torch CI runs.
"""

from __future__ import annotations

import json

import pytest
import torch

from npudist import checkpoint
from npudist.checkpoint import staging
from npudist.checkpoint.staging import HostStaging
from npudist.checkpoint.writer import writer
from npudist.runtime import compat
from tests.conftest import run_py


@pytest.fixture(autouse=True)
def settled():
    writer().close()
    yield
    writer().close()


def _everything_on_device(monkeypatch) -> None:
    monkeypatch.setattr(staging, "on_device", lambda t: True)


def test_forced_device_path_copies_values_into_buffers_reused_per_layout(monkeypatch):
    _everything_on_device(monkeypatch)
    w, b = torch.arange(6.0).reshape(2, 3), torch.ones(4, dtype=torch.bfloat16)
    state = {"model": {"w": w, "b": b, "tied": w}, "opt": [w.t(), 7], "name": "x"}
    stager = HostStaging()
    first = stager.stage(state)
    w.add_(100)
    assert torch.equal(first["model"]["w"], torch.arange(6.0).reshape(2, 3))
    assert first["model"]["tied"] is first["model"]["w"]  # aliases stay aliases
    assert torch.equal(first["opt"][0], torch.arange(6.0).reshape(2, 3).t()) and first["opt"][1] == 7
    assert first["model"]["b"].dtype == torch.bfloat16 and first["name"] == "x"
    pointers = first["model"]["w"].data_ptr(), first["model"]["b"].data_ptr()
    for step in range(2, 5):  # the second stage is the one a reused DefaultStager failed on
        again = stager.stage(state)
        assert torch.equal(again["model"]["w"], w) and again["model"]["w"].data_ptr() != w.data_ptr()
        assert (again["model"]["w"].data_ptr(), again["model"]["b"].data_ptr()) == pointers, step
    assert stager.allocations == 1
    stager.stage({"w": torch.zeros(3)})  # a new layout gets new buffers
    assert stager.allocations == 2


def test_forced_device_path_async_saves_twice_and_each_holds_its_step(tmp_path, monkeypatch):
    _everything_on_device(monkeypatch)
    w = torch.zeros(1000)
    for step in (1, 2, 3):
        w.fill_(step)
        handle = checkpoint.save({"w": w, "step": step}, tmp_path, step, async_save=True)
        w.fill_(-1)  # training goes on after save() returned
        handle.wait()
        loaded, got = checkpoint.load_latest(tmp_path)
        assert got == step and loaded["step"] == step and torch.equal(loaded["w"], torch.full((1000,), step * 1.0))


_SIM_SCRIPT = r"""
import json, sys, tempfile
import torch
from npudist.sim import install
install("npu")
from npudist import checkpoint
from npudist.checkpoint.writer import writer
out = {}
with tempfile.TemporaryDirectory() as root:
    w = torch.zeros(64, device="npu")
    b = torch.ones(8, device="npu", dtype=torch.bfloat16)
    values = []
    for step in (1, 2, 3):
        w.fill_(step)
        h = checkpoint.save({"w": w, "b": b}, root, step, async_save=True)
        w.fill_(-1)
        h.wait()
        loaded, got = checkpoint.load_latest(root)
        values.append([got, loaded["w"].tolist()[0], type(loaded["w"]).__name__, str(loaded["w"].device)])
    out["values"] = values
    out["allocations"] = writer()._staging.allocations
    out["buffers"] = [[str(t.device), type(t).__name__] for t in writer()._staging._buffers]
    writer().close()
sys.stdout.write("RESULT " + json.dumps(out) + "\n")
"""


@pytest.mark.subprocess
@pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")
def test_simulated_npu_state_is_staged_as_of_each_save(tmp_path):
    script = tmp_path / "stage_sim.py"
    script.write_text(_SIM_SCRIPT)
    proc = run_py([str(script)], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT ")).split(" ", 1)[1])
    assert result["values"] == [[s, float(s), "Tensor", "cpu"] for s in (1, 2, 3)]
    # staged as a device's tensors: into two host buffers (w, b) allocated once and reused by saves 2 and 3
    assert result["allocations"] == 1 and result["buffers"] == [["cpu", "Tensor"]] * 2
