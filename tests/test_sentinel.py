"""npudist/training/sentinel.py in one process, its bucket faked: the hooks find the loss of a plain
``loss.backward()``, a flagged step never reaches its optimizer update, a GradScaler's skipped steps are
counted and warn, a spike warns, and uninstall gives torch back as it was."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from npudist.training.sentinel import NonFiniteError, Sentinel


class Bucket:
    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True

    def parameters(self) -> list[torch.Tensor]:
        return []


CTX = SimpleNamespace(rank=0, is_main=True, device=torch.device("cpu"), local_rank=0)


@pytest.fixture
def sentinel(tmp_path):
    lines: list[str] = []
    s = Sentinel(CTX, skip_warn=2, run_dir=str(tmp_path), write=lines.append)
    s.lines = lines
    uninstall = s.install()
    yield s
    uninstall()
    assert not hasattr(torch.Tensor.backward, "__wrapped__")
    assert not hasattr(torch.amp.GradScaler.scale, "__wrapped__")


def _backward(s: Sentinel, w: torch.Tensor, value: float) -> None:
    """One backward whose 'last bucket' (a world of one: reduced as is) goes through the fold."""
    (w * value).sum().backward()
    buf = w.grad.detach().clone().reshape(-1)
    s.fold.before_reduce(Bucket(), buf)
    s.fold.reduced()


def test_a_non_finite_loss_stops_before_the_update_and_is_recorded(sentinel, tmp_path):
    w = torch.ones(2, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.5)
    for value in (1.0, 0.5):
        opt.zero_grad()
        _backward(sentinel, w, value)
        opt.step()
    before = w.detach().clone()
    opt.zero_grad()
    _backward(sentinel, w, math.inf)
    with pytest.raises(NonFiniteError, match=r"non-finite at step 3 on rank 0 \(host .*, card cpu \(local rank 0\)\)"):
        opt.step()
    assert torch.equal(w.detach(), before)  # the update never ran
    assert json.loads((tmp_path / "nonfinite-step3.json").read_text())["culprits"][0]["rank"] == 0


def test_gradscaler_skips_are_counted_and_many_in_a_row_warn(sentinel):
    w = torch.ones(2, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    for value in (math.nan, math.nan, 1.0):  # a scaler skips optimizer.step() after each non-finite backward
        opt.zero_grad()
        _backward(sentinel, w, value)
    assert len(sentinel.lines) == 1 and "2 optimizer steps in a row skipped" in sentinel.lines[0]
    opt.step()  # the finite one goes through
    assert sentinel.skips.count == 0


def test_a_spike_warns_and_the_job_goes_on(sentinel):
    w = torch.ones(2, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.0)
    for value in (1.0, 0.8, 30.0):
        opt.zero_grad()
        _backward(sentinel, w, value)
        opt.step()
    assert len(sentinel.lines) == 1 and "loss spike at step 3 on rank 0" in sentinel.lines[0]


def test_without_a_watched_loop_the_stop_is_one_line_on_rank_0_and_nothing_elsewhere(sentinel, capsys):
    import sys

    before = sys.excepthook
    w = torch.ones(2, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.5)
    _backward(sentinel, w, math.nan)
    with pytest.raises(NonFiniteError) as caught:
        opt.step()
    exc = caught.value
    assert sys.excepthook is not before  # hooked at the stop only
    sys.excepthook(NonFiniteError, exc, None)
    assert capsys.readouterr().out.splitlines() == [str(exc)]
    sentinel.ctx = SimpleNamespace(**{**vars(CTX), "rank": 1, "is_main": False})
    sys.excepthook(NonFiniteError, exc, None)
    out = capsys.readouterr()
    assert out.out == "" and "Traceback" not in out.err
    sentinel._restore_excepthook()
    assert sys.excepthook is before
