"""An ensemble of one process (no process group), runners, and RKNN Lite against tests/fakes/rknnlite."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from npudist.infer import (
    EnsembleError,
    EnsembleServer,
    RKNNLiteRunner,
    RunnerError,
    TorchRunner,
    ensemble_predict,
    select_runner,
)
from tests.conftest import FAKES


def _linear(weight: list[list[float]], bias: list[float]) -> nn.Linear:
    m = nn.Linear(len(weight[0]), len(weight))
    with torch.no_grad():
        m.weight.copy_(torch.tensor(weight))
        m.bias.copy_(torch.tensor(bias))
    return m


def test_world_of_one_is_the_member_itself() -> None:
    # logits for x=[1, 2]: [1*1 + 2*0, 1*0 + 2*1 - 1] = [1, 1] -> tie -> class 0, probabilities 0.5/0.5
    model = _linear([[1.0, 0.0], [0.0, 1.0]], [0.0, -1.0])
    result = ensemble_predict(model, torch.tensor([[1.0, 2.0], [0.0, 3.0]]))
    assert result.world_size == 1
    assert result.labels.tolist() == [0, 1]
    assert result.scores[0].tolist() == pytest.approx([0.5, 0.5])
    assert result.compute_seconds > 0 and result.aggregate_seconds >= 0
    assert result.total_seconds == pytest.approx(result.compute_seconds + result.aggregate_seconds)


def test_member_failure_raises_ensemble_error_and_server_keeps_working() -> None:
    class Picky(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if (x == 999).any():
                raise ValueError("sensor value out of range")
            return torch.zeros(x.shape[0], 3)

    server = EnsembleServer(TorchRunner(Picky(), torch.device("cpu")), num_classes=3)
    with pytest.raises(EnsembleError, match=r"1 of 1 ensemble members failed.*rank 0\): ValueError: sensor"):
        server.predict(torch.full((2, 4), 999.0))
    assert server.predict(torch.zeros(2, 4)).labels.tolist() == [0, 0]
    assert (server.stats.requests, server.stats.errors) == (2, 1)


def test_wrong_class_count_is_reported() -> None:
    server = EnsembleServer(TorchRunner(nn.Linear(4, 2), torch.device("cpu")), num_classes=3)
    with pytest.raises(EnsembleError, match=r"member returned shape \(1, 2\), expected \(1, 3\)"):
        server.predict(torch.zeros(1, 4))


def test_select_runner_uses_torch_off_the_board(tmp_path: Path) -> None:
    runner = select_runner(nn.Linear(2, 2), rknn_path=str(tmp_path / "m.rknn"))
    assert runner.kind == "torch"  # the cpu accelerator here: an .rknn path alone does not switch runtimes
    with pytest.raises(RunnerError, match="no torch model given"):
        select_runner(None)


@pytest.fixture
def fake_rknnlite(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(FAKES))
    for name in [m for m in sys.modules if m.startswith("rknnlite")]:
        monkeypatch.delitem(sys.modules, name)
    import rknnlite.api as api

    api.CALLS.clear()
    return api


def _rknn_model(path: Path, batch: int = 1) -> Path:
    # logits = x @ W + b with W = [[1, 0, 2], [0, 1, -1]], b = [0, 0, 0.5]
    path.write_text(json.dumps({"weight": [[1, 0, 2], [0, 1, -1]], "bias": [0, 0, 0.5], "batch": batch}))
    return path


def test_rknnlite_runner_against_the_fake(fake_rknnlite, tmp_path: Path) -> None:
    runner = RKNNLiteRunner(str(_rknn_model(tmp_path / "member.rknn")), core_mask="0_1_2")
    out = runner(torch.tensor([[1.0, 2.0], [3.0, -1.0]]))
    # row 0: [1, 2, 2 - 2 + 0.5] ; row 1: [3, -1, 6 + 1 + 0.5]
    assert out.tolist() == [[1.0, 2.0, 0.5], [3.0, -1.0, 7.5]]
    calls = fake_rknnlite.CALLS
    assert calls[1] == ("init_runtime", 7)  # NPU_CORE_0_1_2
    assert [c for c in calls if c[0] == "inference"] == [("inference", (1, 2))] * 2  # batch-1 model
    result = ensemble_predict(runner, torch.tensor([[1.0, 2.0]]), combine="vote")
    assert result.labels.tolist() == [1]
    runner.release()
    assert calls[-1] == ("release",)


def test_rknnlite_errors_are_clear(fake_rknnlite, tmp_path: Path) -> None:
    with pytest.raises(RunnerError, match=r"load_rknn\('.*missing.rknn'\) failed"):
        RKNNLiteRunner(str(tmp_path / "missing.rknn"))
    with pytest.raises(RunnerError, match="core_mask '5': choose one of auto, 0, 1, 2, 0_1, 0_1_2, all"):
        RKNNLiteRunner(str(_rknn_model(tmp_path / "m.rknn")), core_mask="5")
    # The real inference() returns None on failure (here: a batch the model was not converted for).
    runner = RKNNLiteRunner(str(_rknn_model(tmp_path / "b1.rknn", batch=1)), core_mask="all", batch_size=2)
    assert fake_rknnlite.CALLS[-1] == ("init_runtime", 0xFFFF)  # NPU_CORE_ALL
    with pytest.raises(RunnerError, match=r"rknnlite inference returned no outputs .*b1.rknn \(batch of 2"):
        runner(torch.tensor([[1.0, 2.0]]))


def test_rknnlite_pads_the_last_chunk_to_the_models_batch(fake_rknnlite, tmp_path: Path) -> None:
    runner = RKNNLiteRunner(str(_rknn_model(tmp_path / "b2.rknn", batch=2)), batch_size=2)
    out = runner(torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.0, 1.0]]))
    assert out.tolist() == [[1.0, 2.0, 0.5], [3.0, -1.0, 7.5], [0.0, 1.0, -0.5]]  # the zero padding is dropped
    assert [c for c in fake_rknnlite.CALLS if c[0] == "inference"] == [("inference", (2, 2))] * 2
    assert runner.core_mask == "auto"


def test_rknnlite_missing_package_is_clear(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "rknnlite", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "rknnlite.api", None)
    with pytest.raises(RunnerError, match="rknn-toolkit-lite2 is not installed"):
        RKNNLiteRunner(str(tmp_path / "m.rknn"))


def test_select_runner_picks_rknnlite_on_a_board(fake_rknnlite, tmp_path: Path) -> None:
    from npudist.accelerators import BY_NAME, Accelerator

    board = Accelerator(BY_NAME["rknpu"])
    runner = select_runner(None, rknn_path=str(_rknn_model(tmp_path / "m.rknn")), core_mask="1", acc=board)
    assert runner.kind == "rknnlite"
    assert fake_rknnlite.CALLS[1] == ("init_runtime", 2)  # NPU_CORE_1


def test_edge_metrics_latency_failures_and_core_mask(fake_rknnlite, tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from npudist.telemetry.exposition.collector_health import CollectorHealth
    from npudist.telemetry.job.edge_metrics import EdgeCollector

    runner = RKNNLiteRunner(str(_rknn_model(tmp_path / "m.rknn")), core_mask="0_1")
    server = EnsembleServer(runner, num_classes=3)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EdgeCollector(CollectorHealth(), ("2", "0", "board2", "", "", ""), lambda: server.stats))
    server.predict(torch.tensor([[1.0, 2.0]]))
    fake_rknnlite.CALLS.clear()
    runner.rknn.ready = False  # the runtime now returns None, as the real one does after an NPU error
    with pytest.raises(EnsembleError, match="1 of 1 ensemble members failed"):
        server.predict(torch.tensor([[1.0, 2.0]]))
    text = generate_latest(registry).decode()
    labels = 'chip="",core_mask="0_1",device="",local_rank="0",node="board2",rank="2",run="",runtime="rknnlite"'
    assert f"npudist_edge_inference_duration_seconds_count{{{labels}}} 2.0" in text
    assert f"npudist_edge_inference_failures_total{{{labels}}} 1.0" in text
    assert f"npudist_edge_runtime_info{{{labels}}} 1.0" in text
