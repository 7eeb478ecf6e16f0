"""Run on 2 ranks by test_pipeline.py: chunked strict all_reduce and the recording switch, one launch.

Prints one JSON line on rank 0 with what the test asserts against hand-worked values.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

import npudist
from npudist import comm
from npudist.comm import pipeline


def main() -> None:
    ctx = npudist.init()
    rank = ctx.rank
    comm.set_profile("hccl-strict")
    pipeline.MIN_BYTES, pipeline.CHUNKS = 0, 4  # force chunking on a small tensor: 4 chunks of 256
    n = 1000  # odd for the 128-multiple: padded to 1024
    index = torch.arange(n)
    out = {}
    # bf16: rank r holds (r + 1) * (index % 7) + 0.5; exact in bf16 (values <= 14.5)
    x = ((rank + 1) * (index % 7) + 0.5).to(torch.bfloat16)
    comm.reset_stats()
    comm.all_reduce(x, "sum")
    out["sum_head"] = x[:8].float().tolist()
    out["sum_tail"] = x[-3:].float().tolist()
    s = comm.stats().get("all_reduce")
    out["kinds"] = {k: v for k, v in s.adaptations.items() if v}
    y = torch.full((n,), float(rank * 2 + 1), dtype=torch.bfloat16)
    comm.all_reduce(y, "avg")
    out["avg_distinct"] = sorted(set(y.float().tolist()))
    z = torch.full((n,), float(-rank - 1), dtype=torch.bfloat16)
    comm.all_reduce(z, "max")  # padding is -inf, so it never wins
    out["max_distinct"] = sorted(set(z.float().tolist()))
    # The recording switch: calls made while off leave the counters as they were.
    before = comm.stats().get("all_reduce").calls
    comm.set_recording(False)
    for _ in range(3):
        comm.all_reduce(torch.ones(4))
    comm.set_recording(True)
    mid = comm.stats().get("all_reduce").calls
    comm.all_reduce(torch.ones(4))
    after = comm.stats().get("all_reduce")
    out["calls"] = [before, mid, after.calls]
    out["count_matches_buckets"] = after.duration_count == after.duration_buckets[-1][1] == after.calls
    dist.barrier()
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    npudist.shutdown()


if __name__ == "__main__":
    main()
