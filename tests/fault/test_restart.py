"""Elastic restarts through torchrun's agent: a killed worker, and nodes that leave, lose no work."""

import random
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO, child_env, run_npudist

pytestmark = pytest.mark.slow
FINAL = re.compile(r"^final step=(\d+) loss=([\d.]+) params_sha256=([0-9a-f]{64})$", re.MULTILINE)
STEP = re.compile(r"^step=(\d+) ", re.MULTILINE)
RESUMED = re.compile(r"^resumed from step=(\d+)", re.MULTILINE)


def _train_args(run_dir, steps, every):
    return ["examples/train_ddp.py", "--steps", str(steps), "--run-dir", str(run_dir), "--checkpoint-every",
            str(every), "--log-every", "1"]


def _workers(parent: psutil.Process) -> list[psutil.Process]:
    return [p for p in parent.children(recursive=True) if "train_ddp.py" in " ".join(p.cmdline())]


def _run_until(proc: subprocess.Popen, pattern: re.Pattern, deadline: float) -> tuple[str, re.Match]:
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
        if m := pattern.search(line):
            return seen, m
    raise AssertionError(f"never saw {pattern.pattern!r}; output so far:\n{seen[-3000:]}")


def test_sigkilled_worker_is_restarted_and_the_result_is_unchanged(tmp_path):
    steps, every = 60, 10
    reference = run_npudist(["launch", "--nproc-per-node", "2", *_train_args(tmp_path / "ref", steps, every)],
                            timeout=240)
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = FINAL.search(reference.stdout).groups()

    kill_at = random.Random(20261202).randint(12, 45)
    proc = subprocess.Popen([sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", "--max-restarts",
                             "2", *_train_args(tmp_path / "run", steps, every)], cwd=REPO, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen, _ = _run_until(proc, re.compile(rf"^step={kill_at} "), time.monotonic() + 120)
        victim = _workers(psutil.Process(proc.pid))[-1]
        victim.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    output = seen + rest
    assert proc.returncode == 0, output[-3000:]
    reached = max(int(s) for s in STEP.findall(seen))
    resumed = int(RESUMED.search(rest).group(1))
    assert resumed <= reached and reached - resumed <= every  # steps recomputed <= checkpoint interval
    assert FINAL.search(output).groups() == expected  # bitwise: same loss text and same parameter hash
