"""200 transformer-shaped gradients (~38 MB float32) reduced four ways, plus DDP's own overhead.

Run on 2 ranks:  python -m npudist launch --nproc-per-node 2 benchmarks/bucketing.py [--blocks 3 --iters 30]
Methods are interleaved in blocks (order rotating) and each sample's time is the slowest rank's;
rank 0 prints medians and ratios, and writes them as JSON with --json PATH.
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
from npudist.comm.state import state as comm_state


def transformer_shapes(layers: int = 16, d: int = 192, vocab: int = 10240, seq: int = 1024) -> list[tuple]:
    """Parameter shapes of a GPT-like model: 12 per layer, embeddings, norms, pooler, head: 200 in all."""
    shapes: list[tuple] = [(vocab, d), (seq, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,),  # ln1, qkv, attention out
                   (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]  # ln2, mlp
    shapes += [(d,), (d,), (d, d), (d,), (vocab // 4, d), (vocab // 4,)]
    return shapes


def one_by_one_npudist(grads):
    for g in grads:
        comm.all_reduce(g)


def one_by_one_raw(grads):
    for g in grads:
        dist.all_reduce(g)


def many(grads):
    comm.all_reduce_many(grads)


def hand_flat(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


class Params(torch.nn.Module):
    def __init__(self, shapes):
        super().__init__()
        self.ps = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s)) for s in shapes)

    def forward(self):
        return sum(p.sum() for p in self.ps)


def sample(fn, iters, warmup=2):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        dist.barrier()
        s = time.perf_counter()
        fn()
        out.append(time.perf_counter() - s)
    return out


def slowest_median(samples):
    t = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return statistics.median(t.tolist())


def pack_cost(numel: int, iters: int) -> dict[str, float]:
    """Packing 64 MiB of tensors into a reused flat buffer vs into one allocated on every call."""
    parts = [torch.ones(numel // 16) for _ in range(16)]
    reused = torch.empty(numel)

    def into_reused():
        torch.cat(parts, out=reused)

    def into_fresh():
        torch.cat(parts)

    a, b = [], []
    for block in range(3):
        for name in (("r", "f") if block % 2 == 0 else ("f", "r")):
            (a if name == "r" else b).extend(sample(into_reused if name == "r" else into_fresh, iters))
    return {"reused_s": statistics.median(a), "fresh_s": statistics.median(b),
            "ratio": statistics.median(a) / statistics.median(b)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    npudist.init()
    shapes = transformer_shapes()
    grads = [torch.zeros(s) for s in shapes]
    total = sum(g.numel() * 4 for g in grads)
    methods = {"raw_one_by_one": one_by_one_raw, "npudist_one_by_one": one_by_one_npudist,
               "all_reduce_many": many, "hand_flatten": hand_flat}
    samples = {m: [] for m in methods}
    names = list(methods)
    for block in range(args.blocks):
        order = names[block % len(names):] + names[:block % len(names)]
        for m in order:
            samples[m] += sample(lambda m=m: methods[m](grads), args.iters)
    med = {m: slowest_median(s) for m, s in samples.items()}
    # DDP: backward of a model whose parameters are these shapes, with and without DDP's bucketing.
    model = Params(shapes)
    ddp = torch.nn.parallel.DistributedDataParallel(Params(shapes))
    plain, wrapped = [], []
    for block in range(args.blocks):
        for which in (("plain", "ddp") if block % 2 == 0 else ("ddp", "plain")):
            mod, out = (model, plain) if which == "plain" else (ddp, wrapped)
            out += sample(lambda mod=mod: mod().backward(), args.iters)
    ddp_plain, ddp_wrapped = slowest_median(plain), slowest_median(wrapped)
    pack = pack_cost(16 * 2**20, args.iters)
    before = comm_state().layouts.builds
    many(grads)
    rebuilt = comm_state().layouts.builds - before
    if dist.get_rank() == 0:
        result = {"tensors": len(shapes), "bytes": total, "world": dist.get_world_size(),
                  "samples_per_method": len(samples["raw_one_by_one"]),
                  "median_s": med, "ddp_backward_s": ddp_wrapped, "plain_backward_s": ddp_plain,
                  "ddp_added_s": ddp_wrapped - ddp_plain,
                  "ratios": {"npudist/raw one by one": med["npudist_one_by_one"] / med["raw_one_by_one"],
                             "all_reduce_many/one by one": med["all_reduce_many"] / med["raw_one_by_one"],
                             "all_reduce_many/hand flatten": med["all_reduce_many"] / med["hand_flatten"]},
                  "pack_64MiB": pack, "bucket_layouts_built_on_a_later_call": rebuilt}
        print(json.dumps(result, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    npudist.shutdown()


if __name__ == "__main__":
    main()
