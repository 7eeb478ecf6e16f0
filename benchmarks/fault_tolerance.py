"""Fault-tolerance figures for the README: what a checkpoint costs the training loop, recovery time
after a killed worker, and steps recomputed.

    python benchmarks/fault_tolerance.py [--rounds 6] [--block-steps 100] [--every 20] [--repeats 3] [--json]

Everything is measured in this run, on this machine: 2 ranks over gloo on the CPU, the example's model
and AdamW state. The cost is measured inside ONE job (benchmarks/checkpoint_cost_rank.py): blocks
without checkpoints, with asynchronous and with synchronous ones, interleaved, so every figure is a
ratio against a baseline of the same job: the time save() holds the loop (slowest rank, per save) as
a share of step time, and the mean step time with checkpoints over the mean without.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
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


def checkpoint_cost(rounds: int, block_steps: int, every: int) -> dict:
    """benchmarks/checkpoint_cost_rank.py on 2 ranks: one job, interleaved blocks without, with
    asynchronous and with synchronous checkpoints."""
    proc = _launch(["benchmarks/checkpoint_cost_rank.py", "--rounds", str(rounds), "--block-steps",
                    str(block_steps), "--every", str(every)])
    out, _ = proc.communicate(timeout=1200)
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"checkpoint cost run failed (exit {proc.returncode}):\n{out[-3000:]}")


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="recovery runs (killed worker -> resumed)")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds of none/async/sync blocks")
    p.add_argument("--block-steps", type=int, default=100)
    p.add_argument("--steps", type=int, default=120, help="steps of each recovery run")
    p.add_argument("--every", type=int, default=20, help="checkpoint interval (the example's default)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    cost = checkpoint_cost(args.rounds, args.block_steps, args.every)
    rec = [recovery(args.steps, args.every, kill_at) for kill_at in (27, 55, 93)[: args.repeats]]
    result = {**cost, "kill_to_first_step_seconds": [r["kill_to_first_step_s"] for r in rec],
              "steps_recomputed": [r["steps_recomputed"] for r in rec]}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"step time without checkpoints (median of {cost['rounds']} blocks of {args.block_steps} steps) "
          f"{cost['step_seconds_no_checkpoints'] * 1e3:.2f} ms")
    for mode in ("async", "sync"):
        c = cost[mode]
        print(f"{mode:5s} save every {args.every}: blocks the loop {c['save_blocks_median_s'] * 1e3:.2f} ms median, "
              f"{c['save_blocks_mean_s'] * 1e3:.2f} ms mean = {c['blocked_share_of_step_time']:.2%} of step time; "
              f"step time ratio with/without {c['step_time_ratio']:.3f}")
    print(f"saves that waited for the previous background write: {cost['waits_for_previous_write']}")
    for r in rec:
        print(f"killed worker -> first step after resume {r['kill_to_first_step_s']:6.2f} s, "
              f"steps recomputed {r['steps_recomputed']}")


if __name__ == "__main__":
    main()
