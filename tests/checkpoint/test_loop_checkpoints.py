"""LoopCheckpoints (checkpoint/loop.py) in one process, a world of one: the run directory claimed, saves at
every N steps and the last, and a resume that gives back model, optimizer, RNG, step and loss."""

import math
import os

import pytest
import torch

import npudist
from npudist import checkpoint
from npudist.checkpoint.lock import LOCK_FILE


class _Ctx:
    rank, world_size, local_world_size, is_main = 0, 1, 1, True


def _model_and_opt(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _train(model, opt, ckpt, steps, *, last):
    for step in steps:
        loss = model(torch.randn(2, 4)).pow(2).mean()  # draws from torch's RNG, which a resume restores
        opt.zero_grad()
        loss.backward()
        opt.step()
        ckpt.after_step(step, model, opt, loss, last=step == last)
    return float(loss.detach())


@pytest.fixture
def released():
    yield
    npudist.shutdown()  # the run directory's lock belongs to this process's Runtime


def test_a_resumed_loop_ends_where_an_uninterrupted_one_does(tmp_path, capsys, released):
    straight, straight_opt = _model_and_opt(0)
    _train(straight, straight_opt, checkpoint.LoopCheckpoints(None, every=3), range(1, 8), last=7)

    run = tmp_path / "run"
    first = checkpoint.LoopCheckpoints(run, every=3, keep=2, async_save=False)
    model, opt = _model_and_opt(0)
    assert first.resume(model, opt, _Ctx()) == 0 and first.source is None and math.isnan(first.loss)
    assert str(os.getpid()) in (run / LOCK_FILE).read_text()
    _train(model, opt, first, range(1, 6), last=7)  # "killed" after step 5: the newest copy is step 3
    assert checkpoint.list_checkpoints(run) == [3] and not math.isnan(first.loss)
    assert checkpoint.describe_newest(run) == f"step 3 in {run}"

    again = checkpoint.LoopCheckpoints(run, every=3, keep=2)
    model, opt = _model_and_opt(1)  # other initial weights: all of it must come from the checkpoint
    with pytest.raises(checkpoint.RunDirBusy):  # the first "job" still holds the directory
        again.resume(model, opt, _Ctx())
    npudist.shutdown()  # the first job's end releases it
    torch.manual_seed(123)  # and another RNG state
    assert again.resume(model, opt, _Ctx()) == 3 and again.source == "disk" and again.loss == first.loss
    assert "resumed from step=3 run_dir=" in capsys.readouterr().out
    _train(model, opt, again, range(4, 8), last=7)
    again.wait()
    assert checkpoint.list_checkpoints(run) == [7, 6]  # every 3 steps, the last one, and keep=2
    assert checkpoint.state_sha256(model) == checkpoint.state_sha256(straight)


def test_without_a_run_directory_nothing_is_written_or_claimed(tmp_path, monkeypatch, released):
    monkeypatch.chdir(tmp_path)
    ckpt = checkpoint.LoopCheckpoints(None, every=1)
    model, opt = _model_and_opt(0)
    assert ckpt.resume(model, opt, _Ctx()) == 0
    _train(model, opt, ckpt, range(1, 4), last=3)
    assert list(tmp_path.iterdir()) == [] and checkpoint.describe_newest(None) == "none"


def test_state_sha256_tells_one_changed_bit_and_a_renamed_tensor_apart():
    a, _ = _model_and_opt(0)
    b, _ = _model_and_opt(0)
    assert checkpoint.state_sha256(a) == checkpoint.state_sha256(b)
    with torch.no_grad():
        b.weight.view(-1)[0] = torch.nextafter(b.weight.view(-1)[0], torch.tensor(math.inf))
    assert checkpoint.state_sha256(a) != checkpoint.state_sha256(b)
    renamed = torch.nn.Sequential(a)  # the same bytes under other names
    assert checkpoint.state_sha256(renamed) != checkpoint.state_sha256(a)


@pytest.mark.parametrize("kwargs", [{"every": 0}, {"keep": 0}])
def test_a_period_or_count_below_one_is_refused(kwargs):
    with pytest.raises(ValueError, match="at least 1"):
        checkpoint.LoopCheckpoints("run", **kwargs)
