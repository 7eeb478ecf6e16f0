"""`npudist launch --dry-run[=N]`: the option read as people write it, the checkpoint round trip of what the
optimizer trains (and its failure named), and a real 2-rank run of the example that stops after 2 steps."""

from __future__ import annotations

import pytest

from npudist.accelerators import BY_NAME, Accelerator
from npudist.launch import LaunchError, plan
from npudist.runtime.settings import DRY_RUN_VAR
from tests.conftest import run_npudist, run_py

CPU = Accelerator(BY_NAME["cpu"])


@pytest.mark.parametrize(("argv", "steps", "script_args"), [
    (["--dry-run", "train.py", "--steps", "9"], "2", ["train.py", "--steps", "9"]),
    (["--dry-run", "5", "train.py"], "5", ["train.py"]),
    (["--dry-run=3", "--nproc-per-node", "2", "train.py", "--dry-run"], "3", ["train.py", "--dry-run"]),
    (["--max-restarts", "1", "--dry-run", "train.py"], "2", ["train.py"]),
])
def test_dry_run_reaches_the_ranks_and_never_torchrun_or_the_script(argv, steps, script_args):
    p = plan(argv, CPU, {})
    assert p.env_updates[DRY_RUN_VAR] == steps
    assert p.torchrun_argv[-len(script_args):] == script_args and p.script == "train.py"
    assert not any(t.startswith("--dry-run") for t in p.torchrun_argv[:-len(script_args)])
    assert any(n.startswith(f"dry run: each rank stops after {steps} optimizer step") for n in p.notes)


def test_without_it_the_script_runs_as_written():
    assert DRY_RUN_VAR not in plan(["train.py"], CPU, {}).env_updates


@pytest.mark.parametrize("value", ["0", "x"])
def test_a_count_that_is_not_positive_is_refused(value):
    with pytest.raises(LaunchError, match=f"--dry-run={value}: give the number of optimizer steps"):
        plan([f"--dry-run={value}", "train.py"], CPU, {})


ROUND_TRIP = """
import sys
from pathlib import Path
import torch
import npudist
from npudist import checkpoint
from npudist.training import dry_run
npudist.init()
model = torch.nn.Linear(4, 3)
opt = torch.optim.Adam(model.parameters())
model(torch.ones(2, 4)).sum().backward()
opt.step()
if sys.argv[2] == "corrupt":
    real = checkpoint.save
    def save(state, directory, step, **kw):
        real(state, directory, step, **kw)
        victim = next(Path(directory).rglob("state.pt"))
        data = bytearray(victim.read_bytes()); data[len(data) // 2] ^= 0xFF; victim.write_bytes(bytes(data))
    checkpoint.save = save
try:
    done = dry_run.round_trip(opt, Path(sys.argv[1]), 1)
    print("ok", done.tensors, done.loaded)
except dry_run.DryRunFailed as exc:
    print("failed:", exc)
npudist.shutdown()
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", ["plain", "corrupt"])
def test_the_round_trip_compares_params_and_optimizer_state_and_names_a_bad_checkpoint(tmp_path, mode):
    done = run_py(["-c", ROUND_TRIP, str(tmp_path / "ck"), mode], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    if mode == "plain":  # 2 params, and Adam's step, exp_avg and exp_avg_sq for each
        assert done.stdout.strip().splitlines()[-1] == "ok 8 True"
    else:
        assert "failed: checkpoint 1 was saved in" in done.stdout and "no good checkpoint loads" in done.stdout


@pytest.mark.e2e
@pytest.mark.slow
def test_the_example_stops_after_two_steps_with_a_checkpoint_round_trip(tmp_path):
    done = run_npudist(["launch", "--dry-run", "--run-dir", str(tmp_path), "examples/train_ddp.py", "--steps",
                        "1000", "--log-every", "1"], timeout=180)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "npudist dry run: 2 optimizer steps ran; a checkpoint of" in out and "loaded back bit-exact" in out
    assert "step=1 " in out and "step=3 " not in out
    assert (tmp_path / "dry-run-checkpoint").is_dir()
