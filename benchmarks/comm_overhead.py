"""Per-call cost of npudist's fast path and of its accounting: 200 small all_reduces, three ways.

Run on 2 ranks:  python -m npudist launch --nproc-per-node 2 benchmarks/comm_overhead.py [--samples 60]

Each sample reduces the 200 bias/norm-sized float32 tensors one by one with (a) plain dist.all_reduce,
(b) npudist.all_reduce, (c) npudist.all_reduce with recording off (comm.set_recording(False)). The three
are interleaved sample by sample, in a rotating order, so load drift on a shared machine hits them
alike; a sample's time is the slowest rank's. Rank 0 prints medians and the two ratios:
npudist/raw (target <= 1.05) and recorded/unrecorded (target <= 1.02).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import npudist
from npudist import comm


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=60)
    p.add_argument("--tensors", type=int, default=200)
    p.add_argument("--numel", type=int, default=768, help="elements per tensor (768 = a d=768 bias)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    npudist.init()
    grads = [torch.zeros(args.numel) for _ in range(args.tensors)]

    def raw() -> None:
        for g in grads:
            dist.all_reduce(g)

    def recorded() -> None:
        for g in grads:
            comm.all_reduce(g)

    def unrecorded() -> None:
        comm.set_recording(False)
        try:
            for g in grads:
                comm.all_reduce(g)
        finally:
            comm.set_recording(True)

    methods = {"raw": raw, "npudist": recorded, "npudist_unrecorded": unrecorded}
    names = list(methods)
    for fn in methods.values():
        fn()
    samples: dict[str, list[float]] = {m: [] for m in names}
    for i in range(args.samples):
        order = names[i % 3:] + names[:i % 3]
        for m in order:
            dist.barrier()
            start = time.perf_counter()
            methods[m]()
            samples[m].append(time.perf_counter() - start)
    med = {}
    for m in names:
        t = torch.tensor(samples[m], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        med[m] = statistics.median(t.tolist())
    if dist.get_rank() == 0:
        result = {"tensors": args.tensors, "numel": args.numel, "samples": args.samples,
                  "median_ms": {m: v * 1e3 for m, v in med.items()},
                  "per_call_us": {m: v * 1e6 / args.tensors for m, v in med.items()},
                  "npudist/raw": med["npudist"] / med["raw"],
                  "recorded/unrecorded": med["npudist"] / med["npudist_unrecorded"]}
        print(json.dumps(result, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    dist.barrier()  # both ranks reach teardown together (a gloo teardown race aborted one rank otherwise)
    npudist.shutdown()


if __name__ == "__main__":
    main()
