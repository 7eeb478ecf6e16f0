"""A plain user loop (tests/examples/plain_loop.py: init, ddp, DataLoader, optimizer; nothing else of npudist's)
under `npudist launch --nproc-per-node 2 --metrics-port P --run-dir D`: its ranks serve their metrics while
it trains, rank 0 prints progress lines with real elapsed time and ETA, and each rank writes its run log."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import REPO, child_env, free_port, run_npudist

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
LINE = re.compile(r"^step=(\d+) samples/s=[\d.]+ done=(\d+)/(\d+) elapsed=(\S+) eta=(\S+) world=2 "
                  r"accelerator=cpu backend=gloo$", re.M)


def _steps_served(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    m = re.search(r"^npudist_steps_total\{[^}]*\} ([\d.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


def _seconds(text: str) -> int:
    m = re.fullmatch(r"(?:(\d+)m)?(\d+)s", text)
    assert m, text
    return int(m.group(1) or 0) * 60 + int(m.group(2))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("plain") / "run"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", "--metrics-port", str(port),
         "--run-dir", str(run_dir), "tests/examples/plain_loop.py", "--epochs", "2", "--step-ms", "80"],
        cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    served: dict[int, float] = {}
    try:
        end = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < end and len(served) < 2:
            for local_rank in (0, 1):
                steps = _steps_served(port + local_rank)
                if steps:  # a step timed and exported while the job runs
                    served[local_rank] = steps
            time.sleep(0.2)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, err[-3000:]
    return run_dir, served, out


def test_both_ranks_serve_their_step_metrics_while_training(plain):
    _run_dir, served, out = plain
    assert sorted(served) == [0, 1], out[-2000:]


def test_rank_0_prints_progress_with_real_elapsed_time_and_eta(plain):
    _run_dir, _served, out = plain
    lines = [(int(s), int(d), int(t), _seconds(e), _seconds(eta)) for s, d, t, e, eta in LINE.findall(out)]
    assert lines, out[-2000:]
    assert all(t == 32 for *_, t, _e, _eta in lines)  # 16 batches a rank a epoch (256 / 8 / 2) x --epochs 2
    last = lines[-1]
    assert last[0] == 32 and last[3] >= 2 and last[4] == 0  # 32 steps of >= 80 ms
    assert all(eta >= 1 for s, *_, eta in lines if s <= 16), lines  # 16 or more steps of >= 80 ms ahead
    elapsed = [e for *_, e, _eta in lines]
    assert elapsed == sorted(elapsed) and elapsed[-1] > elapsed[0]  # counted from the start, not per step
    assert out.count("summary: straggler:") == 1


def test_each_rank_writes_its_run_log(plain):
    run_dir, _served, _out = plain
    for rank in (0, 1):
        records = [json.loads(line) for line in (run_dir / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()]
        assert records[0]["kind"] == "start" and records[0]["start_step"] == 0 and records[0]["world"] == 2
        steps = [r["step"] for r in records if r["kind"] == "step"]
        assert steps[0] == 1 and steps[-1] == 32 and steps == sorted(steps)
        assert [(r["first_step"], r["last_step"]) for r in records if r["kind"] == "skew"] == [(1, 20)]
        assert records[-1]["kind"] == "comm"  # the segment closed at exit, without npudist.shutdown()


def test_ctrl_c_ends_a_plain_loop_with_one_line_from_rank_0(tmp_path):
    """The loop's SIGINT handler and excepthook: rank 0 says where the run stopped, no rank prints a
    traceback (rank 1's collective fails first: its peer left), and the launch exits 130."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"),
         "tests/examples/plain_loop.py", "--epochs", "100", "--step-ms", "100"],
        cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        seen = proc.stdout.readline()  # rank 0's first progress line: both ranks are training
        assert seen.startswith("step=1 "), seen + proc.communicate(timeout=60)[1][-3000:]
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert proc.returncode == 130, err[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1 and re.fullmatch(r"interrupted at step [1-9]\d*; last checkpoint none", lines[0]), out
    assert "Traceback" not in err and "summary:" not in out, err[-3000:]


def test_a_rank_with_slow_batches_is_named_with_cause_data(tmp_path):
    """The DataLoader's __next__ is each step's data time: a rank whose samples take 15 ms a batch to load is
    the straggler, and the cause is its data, by about those 15 ms a step. 320 steps: 16 windows, as a
    2-rank detector learns its noise over the first several (it flagged at windows 7 to 10 here)."""
    done = run_npudist(["launch", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"),
                        "tests/examples/plain_loop.py", "--samples", "5120", "--epochs", "1",
                        "--slow-data-rank", "1", "--slow-data-ms", "15"], env=child_env(), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    line = re.search(r"^straggler: rank 1 .* works ([\d.]+)x .*; cause: data \(it waits for data before the "
                     r"forward, \+([\d.]+) s/step\)", done.stderr, re.M)  # rank 0 logs it, on stderr
    assert line, done.stderr[-3000:] + done.stdout[-1500:]
    assert float(line.group(1)) > 3 and 0.01 < float(line.group(2)) < 0.1, line.group(0)
