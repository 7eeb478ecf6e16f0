"""npudist.loop/step/log/ddp (src/npudist/training/__init__.py) in one process: a world of one, no launcher.

One child process (the hooks are process-wide): a loop without an optimizer marks its steps with
npudist.step(), logs its loss, and after npudist.shutdown() nothing npudist put into torch or Python is
left (DataLoader.__next__, the optimizer hook, the excepthook, SIGINT's handler).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import child_env, run_py

SCRIPT = r'''
import json, signal, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import dataloader as dl
import npudist

ctx = npudist.init(watch=False)  # torch's init_process_group sets an excepthook of its own: after it
before = (dl._BaseDataLoaderIter.__dict__["__next__"], sys.excepthook, signal.getsignal(signal.SIGINT))
assert npudist.loop(total_steps=6, log_every=3) is npudist.loop()  # one loop per rank, configured again
hooked = dl._BaseDataLoaderIter.__dict__["__next__"] is not before[0] and sys.excepthook is not before[1]
w = torch.zeros(3, requires_grad=True)
loader = DataLoader(TensorDataset(torch.ones(12, 3)), batch_size=2)
losses = []
for (x,) in loader:
    loss = (x @ w - 1).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.1 * w.grad  # a hand-written update: no optimizer marks the step
        w.grad = None
    npudist.step()
    npudist.log(loss=loss)
    losses.append(float(loss))
sgd = torch.optim.SGD([w], lr=0.1)
w.grad = torch.zeros(3)
sgd.step()  # after npudist.step(): an optimizer no longer counts
step = npudist.loop().step
try:
    npudist.loop(exchange_every=5)
    late = None
except ValueError as exc:
    late = str(exc)
from npudist.comm.state import state as comm_state
npudist.loop(run_dir=sys.argv[1])  # the hang watchdog writes its reports there too
hang_dir = comm_state().watchdog.run_dir
npudist.shutdown()
after = (dl._BaseDataLoaderIter.__dict__["__next__"], sys.excepthook, signal.getsignal(signal.SIGINT))
print("RESULT " + json.dumps({"hooked": hooked, "step": step, "late": late, "losses": losses, "hang_dir": hang_dir,
                              "restored": [a is b for a, b in zip(before, after)]}))
'''


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_loop_without_an_optimizer_and_what_shutdown_leaves(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    done = run_py([str(script), str(tmp_path / "run")], env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["hang_dir"] == str(tmp_path / "run")
    assert result["hooked"] and result["step"] == 6
    assert result["restored"] == [True, True, True]
    assert "before the loop starts" in result["late"]
    lines = [line.split()[:3] for line in done.stdout.splitlines() if line.startswith("step=")]
    # each line carries the loss its own step logged (logged after the step ended), and samples/s from the
    # batch (2 samples, world of one)
    losses = result["losses"]
    assert [(step, loss) for step, loss, _ in lines] == [(f"step={n}", f"loss={losses[n - 1]:.4f}") for n in (1, 3, 6)]
    assert all(rate.startswith("samples/s=") for *_, rate in lines), done.stdout
    assert "summary: straggler: no window exchanged" in done.stdout


def test_the_public_names_are_exported():
    import npudist

    assert {"loop", "step", "log", "ddp"} <= set(npudist.__all__)
    assert npudist.ddp.__module__ == "npudist.training"


def test_log_and_step_before_init_do_nothing():
    import npudist

    npudist.log(loss=1.0)
    npudist.step()
    with pytest.raises(RuntimeError, match=r"needs npudist\.init"):
        npudist.loop(total_steps=3)
