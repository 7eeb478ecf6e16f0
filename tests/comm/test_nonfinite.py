"""The flag in DDP's last bucket (npudist/comm/nonfinite.py), on fake buckets: what each rank writes before the
reduction, what it reads after, and the NaN check of a checkpoint's state."""

from __future__ import annotations

import math

import pytest
import torch

from npudist.comm.nonfinite import NonFiniteFold, first_nan


class Bucket:
    def __init__(self, index: int, last: bool, params: tuple[torch.Tensor, ...] = ()) -> None:
        self._index, self._last, self._params = index, last, params

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def parameters(self) -> list[torch.Tensor]:
        return list(self._params)


def _backward(fold: NonFiniteFold, loss: float, buckets: list[torch.Tensor]) -> None:
    fold.root = torch.tensor(loss)
    for i, buf in enumerate(buckets):
        fold.before_reduce(Bucket(i, i == len(buckets) - 1, (torch.zeros(1),)), buf)


def test_a_non_finite_loss_makes_the_last_buckets_first_element_nan_and_nothing_else():
    fold = NonFiniteFold()
    first, last = torch.ones(4), torch.ones(3)
    _backward(fold, math.inf, [first, last])
    assert torch.equal(first, torch.ones(4))  # issued before the loss was looked at
    assert math.isnan(last[0].item()) and torch.equal(last[1:], torch.ones(2))
    fold.reduced()
    assert fold.take() is True
    assert fold.take() is None  # taken once
    assert fold.local().loss == math.inf


def test_a_finite_loss_leaves_the_gradients_alone_and_a_peers_nan_still_raises_the_flag():
    fold = NonFiniteFold()
    last = torch.ones(3)
    _backward(fold, 0.5, [last])
    assert torch.equal(last, torch.ones(3))
    last[0] = math.nan  # the sum brought a peer's NaN
    fold.reduced()
    assert fold.take() is True
    assert fold.local().loss is None  # this rank's own loss was finite


def test_a_flag_no_optimizer_step_took_is_a_skipped_step():
    skips: list[bool] = []
    fold = NonFiniteFold(on_skip=skips.append)
    buf = torch.ones(2)
    _backward(fold, math.nan, [buf])
    fold.reduced()  # the GradScaler found inf and skipped optimizer.step(): nobody takes the flag
    buf.fill_(1.0)
    _backward(fold, 1.0, [buf])
    fold.reduced()
    assert skips == [True]
    assert fold.take() is False


def test_scan_mode_names_this_ranks_first_non_finite_bucket():
    fold = NonFiniteFold("scan")
    p = torch.zeros(1)
    bufs = [torch.ones(2), torch.tensor([1.0, math.inf]), torch.tensor([math.nan, 1.0]), torch.ones(2)]
    fold.root = torch.tensor(0.1)
    for i, buf in enumerate(bufs):
        fold.before_reduce(Bucket(i, i == 3, (p,)), buf)
    assert math.isnan(bufs[3][0].item())  # a finite loss, a non-finite bucket: the flag is raised
    fold.reduced()
    assert fold.take() is True
    found = fold.local()
    assert found.bucket == 1 and found.parameters[0] is p and found.loss is None


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="loss, scan, off"):
        NonFiniteFold("everything")


def test_first_nan_walks_a_checkpoint_and_leaves_a_minus_inf_mask_alone():
    good = {"model": {"w": torch.ones(2), "mask": torch.tensor([0.0, -math.inf])}, "step": 3,
            "optim": {"state": {0: {"exp_avg": torch.zeros(2)}}}, "best": math.inf}
    assert first_nan(good) is None
    good["optim"]["state"][0]["exp_avg"][1] = math.nan
    assert first_nan(good) == "optim.state.0.exp_avg"
    assert first_nan([torch.arange(3)]) is None  # integers hold no NaN
