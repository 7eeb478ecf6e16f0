"""Live per-rank phases of a plain loop (tests/examples/plain_loop.py: init, ddp, DataLoader, optimizer) under
`npudist launch --nproc-per-node 2 --metrics-port P`: both ranks serve npudist_rank_phase_seconds_total while
training, and the rank whose batches take 40 ms longer shows it in its data phase and is named with cause
data, by about those 40 ms a step."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, child_env, free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
PHASES = {"data", "compute", "comm_wait", "comm_transfer", "other"}


def _scrape(port: int) -> dict[str, float] | None:
    """{phase: seconds, "steps": n, "step_seconds": sum} of one rank, or None before it served a step."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "npudist_rank_phase_seconds_total":
                out[s.labels["phase"]] = s.value
            elif s.name == "npudist_steps_total":
                out["steps"] = s.value
            elif s.name == "npudist_step_duration_seconds_sum":
                out["step_seconds"] = s.value
    return out if out.get("steps") else None


def test_ranks_serve_their_phases_and_the_slow_data_rank_is_named_with_cause_data():
    port = free_port()
    # 16 steps an epoch (256 samples, 8 a batch, 2 ranks) x 4 epochs = 64 steps; windows of 20 steps.
    proc = subprocess.Popen(
        [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", "--metrics-port", str(port),
         "tests/examples/plain_loop.py", "--epochs", "4", "--slow-data-rank", "1", "--slow-data-ms", "40"],
        cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    served: dict[int, dict[str, float]] = {}
    try:
        end = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < end:
            for rank in (0, 1):
                got = _scrape(port + rank)
                if got is not None and got["steps"] >= 45:  # past the second window: the split is learned
                    served.setdefault(rank, got)
            if len(served) == 2:
                break
            time.sleep(0.2)
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, err[-3000:]
    assert sorted(served) == [0, 1], err[-3000:]
    for rank, got in served.items():
        assert set(got) >= PHASES, got
        total = sum(got[p] for p in PHASES)
        assert abs(total - got["step_seconds"]) <= 0.05 * got["step_seconds"], (rank, got)
    per_step = {rank: {p: got[p] / got["steps"] for p in PHASES} for rank, got in served.items()}
    slow, fast = per_step[1], per_step[0]
    assert 0.03 < slow["data"] < 0.2 and slow["data"] > 5 * fast["data"], per_step
    assert fast["comm_wait"] > 0.015 and fast["comm_wait"] > 5 * slow["comm_wait"], per_step  # rank 0 waits
    line = re.search(r"^phases: rank 1: data \+(\d+) ms per step over steps \d+-\d+; the other ranks wait (\d+)% ",
                     err, re.M)  # rank 0 logs it, on stderr
    assert line, err[-3000:]
    assert 30 <= int(line.group(1)) <= 80 and int(line.group(2)) > 20, line.group(0)
