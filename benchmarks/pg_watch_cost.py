"""What the process-group watch (npudist/comm/pg_watch.py) adds to one collective, against raw torch.

    python benchmarks/pg_watch_cost.py              # 7 interleaved pairs of 20,000 calls each
    python benchmarks/pg_watch_cost.py --pairs 3 --calls 5000

Each run is its own process (the watch's kernels cannot be unloaded from a process): a gloo group of one
rank, OMP_NUM_THREADS=1, ``dist.all_reduce`` of one float in a loop, timed after a warm-up. "raw" never
loads the watch; "watched" loads it first, so every call passes through its kernel and its completion
callback. Runs alternate raw/watched so load on a shared host falls on both; the table gives the medians
and the difference per call, and, as a second reading, a 4-element all_gather_into_tensor and a
functional all_reduce (DTensor's and torch.compile's door).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OPS = ("all_reduce", "all_gather_into_tensor", "funcol_all_reduce")


def child(mode: str, calls: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    if mode == "watched":
        from npudist.comm import pg_watch

        if not pg_watch.load():
            raise SystemExit(f"the watch did not load: {pg_watch.why_off()}")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    one, out, four = torch.ones(1), torch.empty(4), torch.ones(4)

    def run(op: str) -> None:
        if op == "all_reduce":
            dist.all_reduce(one)
        elif op == "all_gather_into_tensor":
            dist.all_gather_into_tensor(out, four)
        else:
            funcol.wait_tensor(funcol.all_reduce(one, "sum", dist.group.WORLD))

    result = {}
    for op in OPS:
        n = calls if op == "all_reduce" else calls // 4
        for _ in range(min(n, 2000)):  # warm-up
            run(op)
        start = time.perf_counter()
        for _ in range(n):
            run(op)
        result[op] = (time.perf_counter() - start) / n * 1e6
    dist.destroy_process_group()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--child", choices=["raw", "watched"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.calls)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src"),
           "NPUDIST_PG_WATCH": "native"}
    from npudist.comm import pg_watch  # build once, outside the timed children

    pg_watch.build()
    runs: dict[str, list[dict[str, float]]] = {"raw": [], "watched": []}
    for _ in range(args.pairs):
        for mode in ("raw", "watched"):
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--calls", str(args.calls)], env=env,
                                 capture_output=True, text=True, timeout=900, check=True)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    import torch

    print(f"torch {torch.__version__}, {args.pairs} interleaved pairs, {args.calls} calls (a quarter for the "
          "other two ops), a gloo group of one rank, microseconds per call (median)\n")
    print("| collective | raw torch | watched | added per call | ratio |")
    print("|---|---|---|---|---|")
    for op in OPS:
        raw = statistics.median(r[op] for r in runs["raw"])
        watched = statistics.median(r[op] for r in runs["watched"])
        print(f"| {op} | {raw:.1f} us | {watched:.1f} us | {watched - raw:+.1f} us | {watched / raw:.3f}x |")


if __name__ == "__main__":
    main()
