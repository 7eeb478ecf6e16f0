"""The NaN sentinel end to end (issue 44, item 4): a plain loop (tests/examples/nan_loop.py) under `npudist launch
--nproc-per-node 2 --run-dir D` with an inf in rank 1's batch at step 30 stops both ranks in step 30 with one
line naming rank 1, its host and card; the newest checkpoint stays step 20 (the last finite state); the same job
with a GradScaler, which skips that step, runs to the end."""

from __future__ import annotations

import json
import re
import socket

import pytest

from tests.conftest import run_npudist

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _launch(run_dir, *extra: str):
    return run_npudist(["launch", "--nproc-per-node", "2", "--run-dir", str(run_dir), "tests/examples/nan_loop.py",
                        "--run-dir", str(run_dir), *extra], timeout=150)


def test_an_inf_in_one_ranks_batch_stops_every_rank_in_that_step(tmp_path):
    proc = _launch(tmp_path, "--save-on-stop")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    stops = re.findall(r"^npudist: non-finite at step (\d+) on (.*)$", proc.stdout, re.M)
    assert len(stops) == 1, out[-3000:]  # one line, from rank 0, not a traceback per rank
    step, who = stops[0]
    assert step == "30"
    assert who.startswith(f"rank 1 (host {socket.gethostname()}, card cpu (local rank 1)): loss=")
    assert "rank 0 " not in who
    assert "trained to step" not in out  # neither rank went on
    assert "Traceback" not in proc.stdout
    # The script caught the stop and tried to save step 30: refused on both ranks.
    assert sorted(re.findall(r"^rank=(\d) save refused: not saving checkpoint 30", proc.stdout, re.M)) == ["0", "1"]
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000010", "step-00000020"]
    doc = json.loads((tmp_path / "nonfinite-step30.json").read_text())
    assert doc["step"] == 30 and [c["rank"] for c in doc["culprits"]] == [1]


def test_a_gradscaler_that_skips_the_bad_step_runs_to_the_end(tmp_path):
    proc = _launch(tmp_path, "--grad-scaler")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert sorted(re.findall(r"^rank=(\d) trained to step=40 params_finite=True$", proc.stdout, re.M)) == ["0", "1"]
    assert "non-finite" not in out
    assert not list(tmp_path.glob("nonfinite-*"))
