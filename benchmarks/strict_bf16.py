"""Why hccl-strict bf16 costs what it does here: the adapted all_reduce against the ways around it.

Run on 2 ranks:  python -m npudist launch --nproc-per-node 2 benchmarks/strict_bf16.py [--iters 15]

The issue's target is hccl-strict bf16 at 16 MiB + 1 element <= 1.25x a plain fp32 all_reduce of the same
element count. Interleaved in 3 blocks (slowest rank per sample, medians), all against "raw fp32":

- npudist c=K: npudist.all_reduce under NPUDIST_COMM_PROFILE=hccl-strict with K pipeline chunks
  (K=1 is cast in, reduce, cast out; comm/pipeline.py's default is 6);
- rs+ag: fp32 reduce_scatter, then each rank's bf16 shard all_gathered as float16 bits (half the bytes
  on the way back; movement may reinterpret bytes, only the reduction needs fp32);
- gather+sum: every rank's bf16 bits all_gathered as float16, summed locally in fp32.

It also measures the CPU budget: process CPU time of one raw fp32 all_reduce (gloo's own threads
included) against its wall time, and the single-threaded cost of the two casts. Every variant's result is
checked bit for bit against the fp32 reduction rounded once to bf16 (#wrong).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("NPUDIST_COMM_PROFILE", "hccl-strict")

import torch
import torch.distributed as dist

import npudist
from npudist.comm import pipeline

ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=15, help="samples per block (3 blocks)")
    p.add_argument("--numel", type=int, default=8 * 2**20 + 1)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    npudist.init()
    rank, world, n = dist.get_rank(), dist.get_world_size(), args.numel
    x0 = (torch.randn(n, generator=torch.Generator().manual_seed(rank)) * 4).to(torch.bfloat16)
    ref = x0.float()
    dist.all_reduce(ref)
    ref = ref.to(torch.bfloat16)
    base = torch.randn(n)
    unit = world * 128  # hccl-strict: element multiple 128 per library call
    padded = -(-n // unit) * unit
    shard = padded // world
    work, part, part16 = torch.empty(padded), torch.empty(shard), torch.empty(shard, dtype=torch.bfloat16)
    gathered = torch.empty(padded, dtype=torch.bfloat16)
    mine = torch.zeros(padded, dtype=torch.bfloat16)
    everyone = torch.empty(world * padded, dtype=torch.bfloat16)
    acc = torch.empty(n)

    def raw(x: torch.Tensor) -> None:
        dist.all_reduce(base)

    def adapted(chunks: int):
        def run(x: torch.Tensor) -> None:
            pipeline.all_reduce_chunked.__defaults__ = (chunks,)
            npudist.all_reduce(x)
        return run

    def rs_ag(x: torch.Tensor) -> None:
        work[:n].copy_(x)
        work[n:].zero_()
        REDUCE_SCATTER(part, work)
        part16.copy_(part)
        ALL_GATHER(gathered.view(torch.float16), part16.view(torch.float16))
        x.copy_(gathered[:n])

    def gather_sum(x: torch.Tensor) -> None:
        mine[:n].copy_(x)
        ALL_GATHER(everyone.view(torch.float16), mine.view(torch.float16))
        rows = everyone.view(world, padded)
        acc.copy_(rows[0, :n])
        for r in range(1, world):
            acc.add_(rows[r, :n])
        x.copy_(acc)

    methods = {"raw fp32": raw, **{f"npudist c={c}": adapted(c) for c in (1, 3, pipeline.CHUNKS, 12)},
               "rs+ag": rs_ag, "gather+sum": gather_sum}
    default_chunks = pipeline.all_reduce_chunked.__defaults__
    wrong = {}
    for name, fn in methods.items():
        if name != "raw fp32":
            x = x0.clone()
            fn(x)
            wrong[name] = int((x.view(torch.int16) != ref.view(torch.int16)).sum())
    names = list(methods)
    samples: dict[str, list[float]] = {k: [] for k in names}
    for _block in range(3):
        for i in range(args.iters):
            for k in names[i % len(names):] + names[:i % len(names)]:
                x = x0.clone()
                dist.barrier()
                start = time.perf_counter()
                methods[k](x)
                t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                samples[k].append(t.item())
    pipeline.all_reduce_chunked.__defaults__ = default_chunks
    budget = _cpu_budget(base, x0)
    if rank == 0:
        r = statistics.median(samples["raw fp32"])
        rows = [{"method": k, "median_ms": statistics.median(samples[k]) * 1e3,
                 "ratio": statistics.median(samples[k]) / r, "wrong": wrong.get(k, 0)} for k in names]
        print(f"{'method':14s} {'median ms':>10s} {'ratio':>7s} {'#wrong':>7s}")
        for row in rows:
            print(f"{row['method']:14s} {row['median_ms']:10.2f} {row['ratio']:7.3f} {row['wrong']:7d}")
        print(json.dumps(budget))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"numel": n, "rows": rows, "cpu_budget": budget}, f, indent=2)
    dist.barrier()
    npudist.shutdown()


def _cpu_budget(base: torch.Tensor, x0: torch.Tensor) -> dict[str, float]:
    """Wall and CPU ms of one raw fp32 all_reduce, and the two casts' single-threaded ms (medians of 15)."""
    wall, cpu = [], []
    for _ in range(15):
        dist.barrier()
        w, c = time.perf_counter(), time.process_time()
        dist.all_reduce(base)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    wide, narrow = torch.empty(x0.numel()), torch.empty_like(x0)
    cast_in, cast_out = [], []
    for _ in range(15):
        t = time.perf_counter()
        wide.copy_(x0)
        cast_in.append(time.perf_counter() - t)
        t = time.perf_counter()
        narrow.copy_(wide)
        cast_out.append(time.perf_counter() - t)
    ms = {"allreduce_wall_ms": wall, "allreduce_cpu_ms": cpu, "cast_in_ms": cast_in, "cast_out_ms": cast_out}
    return {k: statistics.median(v) * 1e3 for k, v in ms.items()}


if __name__ == "__main__":
    main()
