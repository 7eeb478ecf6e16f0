"""Fault-tolerance figures for the README: recovery time after a killed worker, steps recomputed,
checkpoint save time, and checkpointing overhead as a ratio of step time.

    python benchmarks/fault_tolerance.py [--repeats 3] [--steps 120] [--every 20] [--json]

Everything is measured in this run, on this machine: 2 ranks over gloo on the CPU, the example job.
Overhead is a ratio against runs without checkpoints, interleaved in blocks (these machines are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
STEP = re.compile(r"^step=(\d+) ")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "PYTHONUNBUFFERED": "1"}


def _launch(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", *args], cwd=REPO,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def timed_run(steps: int, every: int | None) -> float:
    """Wall seconds between the first and the last logged step (start-up excluded)."""
    with tempfile.TemporaryDirectory() as d:
        extra = ["--run-dir", d, "--checkpoint-every", str(every)] if every else []
        proc = _launch(["examples/train_ddp.py", "--steps", str(steps), "--log-every", "1", *extra])
        first = last = None
        for line in proc.stdout:
            if STEP.match(line):
                now = time.perf_counter()
                first = first or now
                last = now
        proc.wait(timeout=600)
        if proc.returncode != 0 or first is None:
            raise SystemExit(f"training run failed (exit {proc.returncode})")
        return (last - first) / (steps - 1)


def recovery(steps: int, every: int, kill_at: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        proc = _launch(["--max-restarts", "2", "examples/train_ddp.py", "--steps", str(steps), "--log-every", "1",
                        "--run-dir", d, "--checkpoint-every", str(every)])
        reached, killed_at, resumed, first_after = 0, None, None, None
        for line in proc.stdout:
            m = STEP.match(line)
            if killed_at is None and m:
                reached = int(m.group(1))
                if reached >= kill_at:
                    workers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                               if "train_ddp.py" in " ".join(p.cmdline())]
                    workers[-1].send_signal(signal.SIGKILL)
                    killed_at = time.perf_counter()
            elif killed_at is not None and line.startswith("resumed from step="):
                resumed = int(line.split("=")[1].split()[0])
            elif killed_at is not None and resumed is not None and m and first_after is None:
                first_after = time.perf_counter()
        proc.wait(timeout=600)
        if proc.returncode != 0 or first_after is None:
            raise SystemExit(f"recovery run failed (exit {proc.returncode})")
        return {"kill_to_first_step_s": first_after - killed_at, "steps_recomputed": reached - resumed}


def save_seconds(repeats: int) -> float:
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(REPO / "examples"))
    import torch
    from train_ddp import TinyLM

    from npudist import checkpoint

    model = TinyLM(64, 64, 2, 32)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 64, (2, 32))).sum().backward()
    opt.step()
    times = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            t0 = time.perf_counter()
            checkpoint.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": i}, d, i)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="interleaved blocks of with/without checkpoints")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--every", type=int, default=20, help="checkpoint interval (the example's default)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    plain, ckpt = [], []
    for _ in range(args.repeats):
        plain.append(timed_run(args.steps, None))
        ckpt.append(timed_run(args.steps, args.every))
    step_s = statistics.median(plain)
    save_s = save_seconds(30)
    rec = [recovery(args.steps, args.every, kill_at) for kill_at in (27, 55, 93)[: args.repeats]]
    result = {
        "step_seconds_median": step_s,
        "step_seconds_with_checkpoints_median": statistics.median(ckpt),
        "checkpoint_time_ratio": statistics.median(ckpt) / step_s,
        "save_seconds_median": save_s,
        "save_overhead_per_step_ratio": save_s / args.every / step_s,
        "kill_to_first_step_seconds": [r["kill_to_first_step_s"] for r in rec],
        "steps_recomputed": [r["steps_recomputed"] for r in rec],
        "checkpoint_every": args.every,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"step time (median, no checkpoints)      {step_s * 1e3:8.2f} ms")
    with_ckpt = result["step_seconds_with_checkpoints_median"]
    print(f"step time with a checkpoint every {args.every:3d}  {with_ckpt * 1e3:8.2f} ms"
          f"  (ratio {result['checkpoint_time_ratio']:.3f})")
    print(f"one checkpoint save (median of 30)      {save_s * 1e3:8.2f} ms"
          f"  (= {result['save_overhead_per_step_ratio']:.3%} of step time per step at every={args.every})")
    for r in rec:
        print(f"killed worker -> first step after resume {r['kill_to_first_step_s']:6.2f} s, "
              f"steps recomputed {r['steps_recomputed']}")


if __name__ == "__main__":
    main()
