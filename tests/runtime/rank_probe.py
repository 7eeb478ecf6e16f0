"""Run as one rank: join with npudist.init(), do a real all_reduce, print one JSON line."""

import json
import os
import sys

import torch
import torch.distributed as dist

import npudist


def emit(record: dict) -> None:
    """One file per process: ranks share stdout, where their lines would interleave."""
    with open(os.path.join(os.environ["PROBE_OUT"], f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


timeout = float(sys.argv[1]) if len(sys.argv) > 1 else None
try:
    ctx = npudist.init(timeout=timeout)
except npudist.DistInitError as exc:
    emit({"error": str(exc)})
    sys.exit(3)
t = torch.tensor([float(ctx.rank + 1)])
dist.all_reduce(t)
again = npudist.init()
emit({"rank": ctx.rank, "world": ctx.world_size, "local_rank": ctx.local_rank,
                  "local_world": ctx.local_world_size, "node_rank": ctx.node_rank, "source": ctx.source,
                  "backend": ctx.backend, "device": str(ctx.device), "sum": t.item(),
                  "idempotent": again is ctx})
npudist.shutdown()
npudist.shutdown()  # twice is fine
emit({"rank": ctx.rank, "after_shutdown": dist.is_initialized()})
