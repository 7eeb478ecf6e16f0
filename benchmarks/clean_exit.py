"""Finished 2-rank jobs, run many times: does every rank exit 0 (issue 46, "a clean exit, every time")?

Each job is two gloo ranks that join with npudist.init(), take a DDP step through npudist.ddp and end with
an all_reduce they never wait for, its tensor a temporary. Rank 1 posts its side only once rank 0 has
reached its exit hooks, and a random 0-0.3 s later: the collective then completes, and gloo's worker drops
the tensor's Python object, somewhere in rank 0's way out. That is the shape of the exit-time abort
(``terminate called without an active exception``, comm/quiesce.py), its window widened: 1 job in 20
aborted here before the fix, 0 in 50 after.

The ranks are forks of this process, which paid for the imports once, and a TCPStore held here stands in
for torchrun's agent store; each rank leaves through the interpreter's normal finalization (it returns off
the end of this script), which is the exit under test. Prints each failed rank, then ``RESULT {json}``;
exits 1 if any rank failed.

    python benchmarks/clean_exit.py [--jobs 50] [--seed 0] [--no-ddp]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path

# torch._dynamo, fsdp and tensor: what DDP imports on first use (seconds here), paid once before the forks.
import torch
import torch._dynamo
import torch.distributed as dist
import torch.distributed.fsdp
import torch.distributed.tensor

import npudist

LATE_S = 0.3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, late_s: float, ddp: bool, exiting: Path) -> None:
    npudist.init(backend="gloo")
    if ddp:
        model = npudist.ddp(torch.nn.Linear(4, 2))
        model(torch.ones(3, 4)).sum().backward()
    if rank == 0:
        atexit.register(exiting.touch)  # registered after npudist's exit hook, so it runs before it
    else:
        deadline = time.monotonic() + 60
        while not exiting.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(late_s)
    dist.all_reduce(torch.ones(64), async_op=True)  # in flight while rank 0 leaves


def main() -> int | None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-ddp", action="store_true", help="leave out the DDP step (a cheaper job)")
    args = p.parse_args()
    rng = random.Random(args.seed)
    failed: list[dict] = []
    began = time.monotonic()
    marks = Path(tempfile.mkdtemp(prefix="npudist-clean-exit-"))
    for job in range(args.jobs):
        port, late_s, exiting = _free_port(), rng.uniform(0.0, LATE_S), marks / f"job{job}"
        pids = {}
        for rank in (0, 1):
            pid = os.fork()
            if pid == 0:
                os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                                  GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                  TORCHELASTIC_RUN_ID="clean-exit", TORCHELASTIC_USE_AGENT_STORE="True",
                                  TORCHELASTIC_RESTART_COUNT="0", OMP_NUM_THREADS="1")
                _rank(rank, late_s, not args.no_ddp, exiting)
                return None  # off the end of the script: the exit under test
            pids[pid] = rank
        # The job's store, held here as torchrun's agent holds it; the ranks' clients retry until it is up.
        store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)
        for pid, rank in pids.items():
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                failed.append({"job": job, "rank": rank, "late_s": round(late_s, 3), "exit": code})
                print(f"job {job} rank {rank} (peer late {late_s:.3f} s): exit {code}", flush=True)
        del store
        exiting.unlink(missing_ok=True)
    marks.rmdir()
    result = {"jobs": args.jobs, "ranks_failed": len(failed), "failed": failed,
              "seconds": round(time.monotonic() - began, 1), "ddp": not args.no_ddp}
    print("RESULT " + json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    code = main()
    if code is not None:
        sys.exit(code)
