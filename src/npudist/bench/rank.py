"""One rank of `npudist bench collective`: times npudist (and plain torch.distributed) per size.

Started by bench.py through `npudist launch`. Implementations are interleaved in blocks (order
alternating) because shared machines drift; every sample is one collective after a barrier, and its
time is the slowest rank's. Tensors live on this rank's device (NCCL and HCCL take device tensors
only), and each sample waits for the device, since device collectives return before they finish.
Rank 0 prints progress lines and writes the results as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import npudist
from npudist import comm
from npudist.comm.collectives import ALL_GATHER, REDUCE_SCATTER

PROGRESS = "NPUDIST_BENCH_PROGRESS"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npudist.bench.rank")
    p.add_argument("--op", required=True)
    p.add_argument("--redop", default="sum")
    p.add_argument("--dtype", required=True)
    p.add_argument("--baseline-dtype", default=None)
    p.add_argument("--sizes", required=True, help="comma-separated byte sizes")
    p.add_argument("--profile", default=None)
    p.add_argument("--baseline", action="store_true")
    p.add_argument("--odd", action="store_true")
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", required=True)
    return p


def per_rank_count(op: str, size: int, itemsize: int, world: int, odd: bool) -> int:
    """Elements each rank passes in: nccl-tests' size is the full buffer (gather output, scatter input)."""
    count = max(size // itemsize, 1)
    if op in ("all_gather", "reduce_scatter"):
        count = max(count // world, 1)
    return count + 1 if odd else count


def _shape(op: str, per: int, world: int) -> tuple[int, ...]:
    return (world * per,) if op == "reduce_scatter" else (per,)


def _npudist_call(op: str, t: torch.Tensor, redop: str) -> Callable[[], object]:
    if op == "all_reduce":
        return lambda: comm.all_reduce(t, redop)
    if op == "broadcast":
        return lambda: comm.broadcast(t, 0)
    if op == "all_gather":
        return lambda: comm.all_gather(t)
    return lambda: comm.reduce_scatter(t, redop)


def _raw_call(op: str, t: torch.Tensor, redop: str, world: int) -> Callable[[], object]:
    native = comm.collectives.OPS[redop]
    if op == "all_reduce":
        return lambda: dist.all_reduce(t, op=native)
    if op == "broadcast":
        return lambda: dist.broadcast(t, 0)
    if op == "all_gather":
        out = torch.empty(world * t.numel(), dtype=t.dtype, device=t.device)
        return lambda: ALL_GATHER(out, t)
    out = torch.empty(t.numel() // world, dtype=t.dtype, device=t.device)
    return lambda: REDUCE_SCATTER(out, t, op=native)


def count_wrong(op: str, per: int, dtype: torch.dtype, rank: int, world: int, raw: bool,
                device: torch.device | None = None) -> int:
    """Elements that differ from the exact answer, summed over ranks (inputs: rank + 1 + index % 4)."""
    shape = _shape(op, per, world)
    index = torch.arange(shape[0], device=device)
    t = (rank + 1 + index % 4).to(dtype)
    ranks_sum = world * (world + 1) // 2
    if op == "all_reduce":
        (dist.all_reduce(t) if raw else comm.all_reduce(t))
        got, want = t, (ranks_sum + world * (index % 4)).to(dtype)
    elif op == "broadcast":
        (dist.broadcast(t, 0) if raw else comm.broadcast(t, 0))
        got, want = t, (1 + index % 4).to(dtype)
    elif op == "all_gather":
        if raw:
            got = torch.empty(world * per, dtype=dtype, device=device)
            ALL_GATHER(got, t)
        else:
            got = comm.all_gather(t).reshape(-1)
        want = torch.cat([(r + 1 + index % 4).to(dtype) for r in range(world)])
    else:
        if raw:
            got = torch.empty(per, dtype=dtype, device=device)
            REDUCE_SCATTER(got, t)
        else:
            got = comm.reduce_scatter(t)
        mine = index[rank * per:(rank + 1) * per]
        want = (ranks_sum + world * (mine % 4)).to(dtype)
    wrong = (got != want).sum().to(torch.int64).reshape(1)
    dist.all_reduce(wrong)
    return int(wrong.item())


def _time(fn: Callable[[], object], iters: int, warmup: int, sync: Callable[[], None]) -> list[float]:
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(iters):
        dist.barrier()
        sync()
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return samples


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    ctx = npudist.init()
    world, rank, device = ctx.world_size, ctx.rank, ctx.device

    def sync() -> None:
        ctx.accelerator.synchronize(device.index)

    comm.set_profile(args.profile)
    dtype = getattr(torch, args.dtype)
    base_dtype = getattr(torch, args.baseline_dtype or args.dtype)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for i, size in enumerate(sizes):
        per = per_rank_count(args.op, size, dtype.itemsize, world, args.odd)
        shape = _shape(args.op, per, world)
        impls = {"npudist": _npudist_call(args.op, torch.zeros(shape, dtype=dtype, device=device), args.redop)}
        if args.baseline:
            raw_t = torch.zeros(shape, dtype=base_dtype, device=device)
            impls["raw"] = _raw_call(args.op, raw_t, args.redop, world)
        samples: dict[str, list[float]] = {name: [] for name in impls}
        for block in range(args.blocks):
            order = list(impls) if block % 2 == 0 else list(reversed(impls))
            for name in order:
                samples[name] += _time(impls[name], args.iters, args.warmup, sync)
        split = args.op in ("all_gather", "reduce_scatter")
        reduces = args.op in ("all_reduce", "reduce_scatter")
        row = {"size_bytes": size, "count": per * (world if split else 1), "per_rank_count": per,
               "type": args.dtype, "redop": args.redop if reduces else "none"}
        for name in impls:
            slowest = torch.tensor(samples[name], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            row[f"{name}_samples"] = len(samples[name])
            row[f"{name}_median_s"] = statistics.median(slowest.tolist())
        row["wrong"] = count_wrong(args.op, per, dtype, rank, world, raw=False, device=device)
        if args.baseline:
            row["raw_wrong"] = count_wrong(args.op, per, base_dtype, rank, world, raw=True, device=device)
        rows.append(row)
        if rank == 0:
            print(f"{PROGRESS} {i + 1} {len(sizes)} {size} {json.dumps(row)}", flush=True)
    if rank == 0:
        meta = {"op": args.op, "world": world, "backend": ctx.backend, "profile": args.profile,
                "blocks": args.blocks, "iters": args.iters, "odd": args.odd,
                "baseline_type": args.baseline_dtype or args.dtype}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f)
    npudist.shutdown()


if __name__ == "__main__":
    main()
