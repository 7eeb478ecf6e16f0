"""Checkpoints: round trip, retention, corruption fallback, write failures that keep the previous one."""

import errno
import json
import logging

import pytest
import torch

from npudist import checkpoint
from npudist.checkpoint.layout import parse_step, step_dir_name, verify
from npudist.runtime import compat


def _state(step: int) -> dict:
    torch.manual_seed(step)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state(), "step": step}


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b


def test_round_trip_of_model_optimizer_and_rng(tmp_path):
    state = _state(7)
    path = checkpoint.save(state, tmp_path, 7)
    assert path == tmp_path / "step-00000007"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 7 and set(manifest["files"]) == {"state.pt"}
    loaded, step = checkpoint.load_latest(tmp_path)
    assert step == 7
    _assert_same(state, loaded)


def test_nothing_to_resume_is_none(tmp_path):
    assert checkpoint.load_latest(tmp_path) is None
    assert checkpoint.load_latest(tmp_path / "missing") is None


def test_keeps_the_last_k(tmp_path):
    for step in (10, 20, 30, 40):
        checkpoint.save({"step": step}, tmp_path, step, keep=2)
    assert checkpoint.list_checkpoints(tmp_path) == [40, 30]
    assert not list(tmp_path.glob(".tmp-*"))


def test_step_names_sort_and_parse():
    assert step_dir_name(5) == "step-00000005" and parse_step("step-00000005") == 5
    assert parse_step(".tmp-step-00000005") is None and parse_step("step-5") is None
    with pytest.raises(ValueError, match="step must be >= 0"):
        step_dir_name(-1)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "truncated"),
        (lambda p: p.write_bytes(bytes([p.read_bytes()[0] ^ 0xFF]) + p.read_bytes()[1:]), "sha256"),
        (lambda p: p.unlink(), "missing"),
        (lambda p: (p.parent / "manifest.json").write_text("{not json"), "manifest.json unreadable"),
    ],
)
def test_damaged_newest_falls_back_to_previous_and_says_so(tmp_path, caplog, damage, reason):
    checkpoint.save({"w": torch.full((1000,), 1.0)}, tmp_path, 1)
    checkpoint.save({"w": torch.full((1000,), 2.0)}, tmp_path, 2)
    damage(tmp_path / "step-00000002" / "state.pt")
    with caplog.at_level(logging.WARNING, logger="npudist.checkpoint"):
        state, step = checkpoint.load_latest(tmp_path)
    assert step == 1 and torch.equal(state["w"], torch.full((1000,), 1.0))
    assert "step-00000002" in caplog.text and reason in caplog.text and "falling back" in caplog.text


def test_an_unfinished_write_is_ignored(tmp_path):
    checkpoint.save({"w": torch.ones(2)}, tmp_path, 3)
    (tmp_path / ".tmp-step-00000004").mkdir()
    (tmp_path / ".tmp-step-00000004" / "state.pt").write_bytes(b"partial")
    assert checkpoint.load_latest(tmp_path)[1] == 3
    checkpoint.save({"w": torch.ones(2)}, tmp_path, 4)  # the next save of that step cleans it up
    assert verify(tmp_path / "step-00000004")[1] is None


def _failing_save(err: int):
    def fail(obj, f, *a, **kw):
        f.write(b"x" * 100)  # part of the file made it to disk before the error
        raise OSError(err, "simulated")

    return fail


@pytest.mark.parametrize(
    ("err", "text"),
    [(errno.ENOSPC, "no space left on the device"), (errno.EACCES, "permission denied")],
)
def test_write_failure_is_clear_and_previous_checkpoint_intact(tmp_path, monkeypatch, err, text):
    checkpoint.save({"w": torch.ones(3)}, tmp_path, 5)
    before = (tmp_path / "step-00000005" / "state.pt").read_bytes()
    monkeypatch.setattr(torch, "save", _failing_save(err))
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.save({"w": torch.zeros(3)}, tmp_path, 6)
    message = str(caught.value)
    assert "step 6" in message and text in message and "previous checkpoint (step 5) is untouched" in message
    assert checkpoint.list_checkpoints(tmp_path) == [5]
    assert not list(tmp_path.glob(".tmp-*"))
    assert (tmp_path / "step-00000005" / "state.pt").read_bytes() == before
    assert checkpoint.load_latest(tmp_path)[1] == 5


def test_a_file_that_is_not_a_checkpoint_never_runs_code(tmp_path, caplog):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    checkpoint.save({"w": torch.ones(1)}, tmp_path, 1)
    path = checkpoint.save({"w": torch.ones(1)}, tmp_path, 2)
    payload = pickle.dumps({"x": Evil()})
    (path / "state.pt").write_bytes(payload)
    manifest = json.loads((path / "manifest.json").read_text())  # re-sign it so only weights_only protects us
    from npudist.checkpoint.layout import sha256_file

    manifest["files"]["state.pt"] = {"sha256": sha256_file(path / "state.pt"), "bytes": len(payload)}
    (path / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="npudist.checkpoint"):
        assert checkpoint.load_latest(tmp_path)[1] == 1
    assert "did not load" in caplog.text


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.skipif(not compat.has("dcp_async_save"), reason="DCP async_save arrived in torch 2.3")
def test_sharded_save_and_load_on_two_ranks_sync_and_async(tmp_path):
    from tests.conftest import REPO, run_npudist

    done = run_npudist(["launch", "--nproc-per-node", "2", str(REPO / "tests/checkpoint/sharded_probe.py"),
                        str(tmp_path)], timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in results:
        assert r["step"] == 4 and r["w"] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0] and r["b"] == [7.0, 7.0]
    assert [r["writer"] for r in results] == [True, False]
    assert [(r["async_step"], r["async_w"]) for r in results] == [(8, [100.0, 101, 102, 103, 104, 105])] * 2
    manifest = json.loads((tmp_path / "step-00000004" / "manifest.json").read_text())
    assert manifest["kind"] == "sharded" and ".metadata" in manifest["files"]
    assert verify(tmp_path / "step-00000004")[1] is None
