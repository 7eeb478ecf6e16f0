"""The consistent view of a peer snapshot: the plan of what is copied at the call, the optimizers' tensors
copied on the stager into buffers reused from one snapshot to the next, and a copy dropped when the
state's layout changed under the plan (peer_view.py, issue 46)."""

import io
import json
import time

import pytest
import torch

import npudist
from npudist.checkpoint import peer as peer_mod
from npudist.checkpoint.peer_holder import serving
from npudist.checkpoint.peer_pack import FlatCopy, pack, to_bytes, unpack
from npudist.checkpoint.peer_view import assemble, at, owned_storages, walk
from npudist.checkpoint.writer import writer
from npudist.runtime import compat
from tests.conftest import run_py

SECRET = bytes.fromhex("7a" * 32)


def _trained():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)

    def step():
        opt.zero_grad()
        model(torch.randn(8, 4)).square().mean().backward()
        opt.step()

    step()
    return model, opt, step


def _state(model, opt, step):
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step, "rng": torch.get_rng_state(),
            "notes": ["kept", 1.5]}


def test_the_plan_names_what_may_change_before_the_next_step_and_nothing_the_optimizer_owns():
    model, opt, _ = _trained()
    state = _state(model, opt, 3)
    view = walk(state, {}, owned_storages([opt]))
    # The BatchNorm buffers change in a forward, the RNG state is the caller's: copied at the call.
    assert set(view.plan) == {("model", "1.running_mean"), ("model", "1.running_var"),
                              ("model", "1.num_batches_tracked"), ("rng",)}
    assert view.missed == view.plan  # nothing was copied at the call here
    # Parameters (4) and AdamW's step, exp_avg and exp_avg_sq of each (12): the stager copies those.
    assert len(view.owned) == 16
    assert walk(state, {p: None for p in view.plan}, owned_storages([opt])).missed == ()
    # Without a known optimizer every tensor is copied at the call (a snapshot before the first step).
    assert ("model", "0.weight") in walk(state, {}, set()).plan


def test_assemble_puts_the_copies_in_place_and_keeps_the_layout():
    model, opt, _ = _trained()
    state = _state(model, opt, 3)
    view = walk(state, {}, owned_storages([opt]))
    early = {p: torch.full((1,), 7.0) for p in view.plan}
    copies = {id(t): t.detach().clone() for t in view.owned}
    out = assemble(state, early, lambda t, path: copies[id(t)])
    assert out["model"]._metadata == state["model"]._metadata  # load_state_dict reads it
    assert torch.equal(out["rng"], torch.full((1,), 7.0))
    assert out["notes"] == ["kept", 1.5] and out["notes"] is not state["notes"]
    w = out["model"]["0.weight"]
    assert torch.equal(w, model[0].weight) and w.untyped_storage().data_ptr() != \
        model[0].weight.untyped_storage().data_ptr()
    assert at(out, ("optim", "param_groups", 0, "lr")) == 0.1


def test_a_packed_copy_unpacks_to_the_state_with_each_tensor_its_own():
    model, opt, _ = _trained()
    state = {**_state(model, opt, 3), "pair": (model[0].bias, 2), "half": torch.arange(4).to(torch.bfloat16)}
    storages = owned_storages([opt]) | {state["half"].untyped_storage().data_ptr()}
    view = walk(state, {}, storages)
    early = {p: at(state, p).clone() if isinstance(at(state, p), torch.Tensor) else at(state, p) for p in view.plan}
    flat = FlatCopy()
    payload = to_bytes(pack(state, early, view.owned, flat))
    assert len(flat.buffers) == 2  # float32 (parameters, AdamW state and step counters) and bfloat16
    back = unpack(payload)
    assert torch.equal(back["pair"][0], model[0].bias) and back["pair"][1] == 2
    assert back["half"].dtype == torch.bfloat16 and torch.equal(back["half"], state["half"])
    for k, v in state["model"].items():
        assert torch.equal(back["model"][k], v), k
    exp_avg = back["optim"]["state"][0]["exp_avg"]
    assert torch.equal(exp_avg, opt.state[model[0].weight]["exp_avg"])
    assert exp_avg.untyped_storage().nbytes() == exp_avg.nbytes  # its own copy, not a view of the flat buffer
    model.load_state_dict(back["model"])
    opt.load_state_dict(back["optim"])
    with pytest.raises(ValueError, match="cut short"):
        unpack(payload[:-1])
    old = io.BytesIO()
    torch.save({"w": torch.ones(2)}, old)  # a copy sent before this format loads as it is
    assert torch.equal(unpack(old.getvalue())["w"], torch.ones(2))


@pytest.fixture
def sender():
    with serving("127.0.0.1", secret=SECRET) as server:
        writer().peer = peer_mod.PeerSnapshots(1, server.address, server.address, rank=0, world=1, partner=0,
                                               secret=SECRET)
        yield writer().peer, server
    npudist.shutdown()


def _held(server, step):
    copy = server.holder.get(0, 1, step)
    return unpack(copy.payload)


def test_copies_in_reused_buffers_keep_the_values_of_their_own_step(sender, monkeypatch):
    """The stager copies the parameters and optimizer state into the same buffers each snapshot, while the
    loop runs on: each copy must be the state at its call though the next step changed the parameters in
    place right after it, and the buffers were reused by the next copies."""
    p, server = sender
    model, opt, step = _trained()
    slow = peer_mod.walk
    monkeypatch.setattr(peer_mod, "walk", lambda *a: (time.sleep(0.2), slow(*a))[1])
    expected = {}
    for s in (1, 2, 3):
        expected[s] = (model[0].weight.detach().clone(), opt.state[model[0].weight]["exp_avg"].clone())
        p.snapshot(_state(model, opt, s), s)
        step()  # waits for the stager's copy, then changes the parameters and the optimizer state in place
        assert p._sent.wait(30)
    assert p._owned_copy.allocations == 1  # one set of buffers, reused by the second and third copies
    assert not torch.equal(model[0].weight, expected[3][0])
    for s in (2, 3):  # the holder keeps the last two
        held = _held(server, s)
        assert torch.equal(held["model"]["0.weight"], expected[s][0])
        assert torch.equal(held["optim"]["state"][0]["exp_avg"], expected[s][1])
    assert p._plan is not None and ("model", "0.weight") not in p._plan


def test_a_leaf_outside_the_plan_drops_that_copy_and_the_next_one_copies_it(sender, caplog):
    p, server = sender
    model, opt, _ = _trained()
    p.snapshot(_state(model, opt, 1), 1)
    assert p._sent.wait(30)
    extra = torch.arange(3.0)  # a tensor no optimizer owns, new since the plan: not copied at the call
    p.snapshot({**_state(model, opt, 2), "extra": extra}, 2)
    assert p._sent.wait(30)
    assert p.stats.skipped == 1 and "step 2 skipped: extra changed layout" in caplog.text
    p.snapshot({**_state(model, opt, 3), "extra": extra}, 3)
    extra.add_(10.0)  # after the call: the copy holds the value at the call
    assert p._sent.wait(30)
    assert [s for s, _, _ in server.holder.listing(0, 1)] == [1, 3]
    assert torch.equal(_held(server, 3)["extra"], torch.arange(3.0))
    # A plan path the state no longer has: the call walks the state again, and the copy is taken.
    state = _state(model, opt, 4)
    del state["rng"]
    p.snapshot(state, 4)
    assert p._sent.wait(30)
    assert "rng" not in _held(server, 4) and p.stats.skipped == 1 and p.stats.failures == 0


_SIM_SCRIPT = r"""
import json, sys, tempfile
import torch
from npudist.sim import install
install("npu")
import npudist
from npudist.checkpoint import peer as peer_mod
from npudist.checkpoint.peer_holder import serving
from npudist.checkpoint.writer import writer
SECRET = b"k" * 32
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).to("npu")
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
def step():
    opt.zero_grad()
    model(torch.randn(8, 4, device="npu")).square().mean().backward()
    opt.step()
step()
with serving("127.0.0.1", secret=SECRET) as server, tempfile.TemporaryDirectory() as root:
    p = peer_mod.PeerSnapshots(1, server.address, server.address, rank=0, world=1, partner=0, secret=SECRET)
    writer().peer = p
    for s in (1, 2, 3):
        expected = model[0].weight.detach().cpu().clone()
        p.snapshot({"model": model.state_dict(), "optim": opt.state_dict(), "step": s}, s)
        step()
        assert p._sent.wait(30)
    found = peer_mod.restore(root, p)
    out = {"step": found.step, "equal": torch.equal(found.state["model"]["0.weight"], expected),
           "device": str(found.state["model"]["0.weight"].device), "allocations": p._staging.allocations,
           "skipped": p.stats.skipped, "failures": p.stats.failures}
npudist.shutdown()
sys.stdout.write("RESULT " + json.dumps(out) + "\n")
"""


@pytest.mark.subprocess
@pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")
def test_device_state_is_copied_at_the_call_into_reused_host_buffers(tmp_path):
    """On a (simulated) NPU no tensor is the optimizers' host tensor: the plan names them all and the call
    copies them into HostStaging's reused buffers; each copy still holds its own step's values."""
    script = tmp_path / "peer_sim.py"
    script.write_text(_SIM_SCRIPT)
    proc = run_py([str(script)], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT ")).split(" ", 1)[1])
    assert result == {"step": 3, "equal": True, "device": "cpu", "allocations": 1, "skipped": 0, "failures": 0}
