"""What a user sees on the console of examples/train_ddp.py under `npudist launch`: rank 0's progress, an
end-of-run summary, a re-run that has nothing to do, and Ctrl-C."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, child_env, run_npudist

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
SMALL = ["--d-model", "16", "--layers", "1", "--seq-len", "8", "--global-batch-size", "8"]
SKEW_LINE = re.compile(r"^(?!summary: ).*\b(skew|straggler)", re.IGNORECASE | re.MULTILINE)
"""A console line about skew or a straggler other than the summary's, whatever its wording."""


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """A 200-step run with rank 1 slowed by 30 ms a step: every 20-step window is skewed."""
    run_dir = tmp_path_factory.mktemp("console") / "run"  # no "skew" in the paths the log prints
    done = run_npudist(["launch", "--nproc-per-node", "2", "examples/train_ddp.py", "--steps", "200",
                        "--run-dir", str(run_dir), "--slow-rank", "1", "--slow-ms", "30", "--log-every", "50",
                        "--checkpoint-every", "100", "--straggler-diagnosis", "1", *SMALL],
                       env=child_env(), timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir, done


def test_a_skewed_run_ends_with_a_summary(skewed):
    run_dir, done = skewed
    summary = [line for line in done.stdout.splitlines() if line.startswith("summary: ")]
    assert len(summary) == 3, done.stdout
    skew = re.match(r"summary: straggler: rank 1 flagged in (\d+) of 10 windows, at .*?([\d.]+)x (?:at worst )?"
                    r"\(steps \d+-\d+\) the median of the other ranks; \d+ window\(s\) with a flagged rank, "
                    r"max skew [\d.]+$", summary[0])
    slowest = re.match(r"summary: straggler: no rank flagged in 10 windows \(max skew [\d.]+\); rank 1 was the "
                       r"slowest in 10 of 10 windows \(median ([\d.]+)x the median of the others\), below the flag "
                       r"threshold$", summary[0])
    # Two ranks learn a rank that is slow from the first step as noise unless its window-to-window changes
    # are quiet: on a loaded host it may stay below the threshold for 10 windows (docs/engineering/straggler.md). Either
    # way the summary must say who and how slow, and where the diagnoses are.
    assert (skew is not None and int(skew.group(1)) >= 1 and float(skew.group(2)) > 1.3) or \
        (slowest is not None and float(slowest.group(1)) > 1.3), summary[0]
    diagnoses = sorted(run_dir.glob("straggler-step*.json"))
    assert bool(diagnoses) == (skew is not None)
    assert summary[1] == "summary: straggler diagnoses: " + (", ".join(map(str, diagnoses)) or "none")
    assert re.match(rf"summary: checkpoints: 2 written in {re.escape(str(run_dir))} \(kept: step 100, step 200\); "
                    r"save blocked training \d+ ms and wrote for \d+ ms on average; 0 failed$", summary[2])


def test_a_skewed_run_prints_at_most_two_skew_lines(skewed):
    """Once when the detector flags the slow rank, once when it recovers: not one line per window."""
    _run_dir, done = skewed
    console = done.stdout + done.stderr
    assert len(SKEW_LINE.findall(console)) <= 2, console[-4000:]


def test_a_second_run_says_there_is_nothing_to_do(skewed):
    run_dir, _ = skewed
    again = run_npudist(["launch", "--nproc-per-node", "2", "examples/train_ddp.py", "--steps", "200",
                         "--run-dir", str(run_dir), *SMALL], env=child_env(), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"already at step 200 in {run_dir}: raise --steps" in again.stdout
    assert f"or remove {run_dir}" in again.stdout


def test_a_resumed_run_continues_its_step_numbers(skewed):
    """After the second run found nothing to do: resumed to 240, its skew windows, run log records and lines
    go on from step 201 (they used to start again at 1, so the report's charts stopped at the resume)."""
    run_dir, _ = skewed
    done = run_npudist(["launch", "--nproc-per-node", "2", "examples/train_ddp.py", "--steps", "240",
                        "--run-dir", str(run_dir), "--log-every", "20", *SMALL], env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line.split()[0] for line in done.stdout.splitlines() if line.startswith("step=")] == \
        ["step=220", "step=240"]
    records = [json.loads(line) for line in (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert [r["start_step"] for r in records if r["kind"] == "start"] == [0, 200]  # none for the run with nothing to do
    windows = [(r["first_step"], r["last_step"]) for r in records if r["kind"] == "skew"]
    assert windows == [(s - 19, s) for s in range(20, 241, 20)]
    assert [r["step"] for r in records if r["kind"] == "step"] == [1, 50, 100, 150, 200, 220, 240]


def _interrupt_at(run_dir, phase, *extra):
    """Launch with rank 1 held at ``phase``; Ctrl-C once it says so (rank 0 then waits for it in a
    collective or in the rendezvous). Returns (exit code, stdout, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", "examples/train_ddp.py",
         "--steps", "100000", "--run-dir", str(run_dir), "--checkpoint-every", "3", "--sync-checkpoints",
         "--log-every", "1000", "--hold-at", phase, *extra, *SMALL], cwd=REPO, env=child_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        seen = []
        for line in proc.stdout:  # rank 1's line comes through the launcher's stdout
            seen.append(line)
            if line.startswith(f"HOLD {phase} "):
                break
        assert seen and seen[-1].startswith("HOLD"), "".join(seen) + proc.communicate(timeout=30)[1][-3000:]
        time.sleep(2)  # rank 0 reaches the collective (or the rendezvous) that waits for rank 1
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode, "".join(seen) + out, err


def _one_line(code, out, err, step, checkpoint):
    assert code == 130, err[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("interrupted")]
    assert lines == [f"interrupted at step {step}; last checkpoint {checkpoint}; run the same command to resume"], \
        out + err[-3000:]
    assert "Traceback" not in err, err[-3000:]


def test_ctrl_c_while_rank_0_waits_in_the_rendezvous(tmp_path):
    _one_line(*_interrupt_at(tmp_path / "run", "init"), step=0, checkpoint="none")


def test_ctrl_c_after_the_first_checkpoint_and_while_resuming(tmp_path):
    """Rank 0 is blocked in the next gradient all-reduce when the SIGINT comes; rank 1, sleeping in Python,
    leaves first, so rank 0's collective fails before its own KeyboardInterrupt is raised."""
    run_dir = tmp_path / "run"
    _one_line(*_interrupt_at(run_dir, "checkpoint"), step=3, checkpoint=f"step 3 in {run_dir}")
    _one_line(*_interrupt_at(run_dir, "resume"), step=3, checkpoint=f"step 3 in {run_dir}")


def test_ctrl_c_ends_with_one_line_naming_step_and_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", "examples/train_ddp.py",
         "--steps", "100000", "--run-dir", str(run_dir), "--checkpoint-every", "5", "--sync-checkpoints",
         "--log-every", "1000", *SMALL], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        end = time.monotonic() + 180
        while not list(run_dir.glob("step-*")) and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.5)
        assert list(run_dir.glob("step-*")), proc.communicate(timeout=30)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert proc.returncode == 130, err[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1, out
    assert re.fullmatch(rf"interrupted at step \d+; last checkpoint step \d+ in {re.escape(str(run_dir))}; "
                        r"run the same command to resume", lines[0])
    assert "Traceback" not in err and "closing signal" not in err, err[-3000:]
