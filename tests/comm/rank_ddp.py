"""Runs inside each rank for test_ddp.py: npudist.ddp against plain DDP, one launch per world size.

``OUT_DIR [hang]``: every case below, results in OUT_DIR/rank{R}.json; then, with ``hang``, the last
rank sleeps past the collective timeout before its 3rd backward (the job must fail, naming it).

References are plain torch: DDP with its default hook, or DDP with a hand-written hook that reduces
each bucket in float32 and casts back. Nothing here calls npudist to compute an expected value.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import npudist
from npudist import comm
from npudist.comm.ddp import gradient_sync
from npudist.runtime import compat

STEPS = 4
# Odd sizes: under hccl-strict every bucket needs padding to 128 elements as well as the cast.
IN, HIDDEN, OUT = 13, 37, 5


class Net(nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(IN, HIDDEN)
        self.b = nn.Linear(HIDDEN, OUT)
        self.spare = nn.Linear(IN, 3) if unused else None  # never used in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def batch(rank: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's fixed batch (the same every step, so the loss must fall)."""
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(8, IN, generator=g)
    w = torch.linspace(-1, 1, IN * OUT).view(IN, OUT)  # the same target map on every rank
    return x.to(dtype), (x @ w).to(dtype)


def train(model: nn.Module, rank: int, dtype: torch.dtype, steps: int = STEPS, lr: float = 0.1) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    x, y = batch(rank, dtype)
    for _ in range(steps):
        loss = F.mse_loss(model(x).float(), y.float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def build(dtype: torch.dtype, unused: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return Net(unused).to(dtype)


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    inner = model.module if isinstance(model, DDP) else model
    return {n: p.detach().clone() for n, p in inner.named_parameters()}


def same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names of parameters whose bytes differ."""
    return [n for n in a if not torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8))]


def fp32_reference(calls: list[int], bucket):
    """A hand-written DDP hook: the bucket as float32, summed, divided by the world size, cast back."""
    calls[0] += 1
    buf = bucket.buffer()
    wide = buf.to(torch.float32)
    dist.all_reduce(wide)
    wide.div_(dist.get_world_size())
    buf.copy_(wide.to(buf.dtype))
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def default_vs_plain(rank: int, only: tuple[str, ...] | None = None) -> dict:
    """fp32, default profile: npudist.ddp and plain DDP, with DDP's options passed through."""
    out = {}
    cases = {"defaults": {}, "find_unused_parameters": {"find_unused_parameters": True},
             "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
             "static_graph": {"static_graph": True}, "bucket_cap_mb": {"bucket_cap_mb": 0.001}}
    for name, kwargs in cases.items():
        if only is not None and name not in only:
            continue
        unused = name == "find_unused_parameters"
        plain = DDP(build(torch.float32, unused), **kwargs)
        train(plain, rank, torch.float32)
        mine = npudist.ddp(build(torch.float32, unused), **kwargs)
        train(mine, rank, torch.float32)
        out[name] = {"differ": same_bits(params(plain), params(mine)), "buckets": gradient_sync(mine).buckets}
    return out


def counting_allreduce(calls: list[int], bucket):
    """DDP's default hook, counting the buckets (how many reductions npudist must have made)."""
    calls[0] += 1
    return default_hooks.allreduce_hook(dist.group.WORLD, bucket)


SMALL_BUCKET_MB = 1e-4


@contextlib.contextmanager
def small_first_bucket():
    """Several buckets per step on every torch: until DDP's ``bucket_cap_mb`` defaulted to None (an explicit cap
    then bounds the first bucket too), the first bucket was capped by ``dist._DEFAULT_FIRST_BUCKET_BYTES``
    (1 MiB) whatever ``bucket_cap_mb`` said, so this model's gradients made one bucket (torch 2.1)."""
    if inspect.signature(DDP).parameters["bucket_cap_mb"].default is None:
        yield
        return
    before = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(SMALL_BUCKET_MB * 1024 * 1024)
    try:
        yield
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = before


def accounting(rank: int) -> dict:
    """Calls and bytes after 3 steps, with small buckets so there are several per step."""
    calls = [0]
    with small_first_bucket():
        plain = DDP(build(torch.float32), bucket_cap_mb=SMALL_BUCKET_MB)
    plain.register_comm_hook(calls, counting_allreduce)
    train(plain, rank, torch.float32, steps=3)
    with small_first_bucket():
        model = npudist.ddp(build(torch.float32), bucket_cap_mb=SMALL_BUCKET_MB)
    comm.reset_stats()
    train(model, rank, torch.float32, steps=3)
    s = comm.stats().get("all_reduce")
    grads = [p for p in model.parameters() if p.requires_grad]
    return {"calls": s.calls, "bytes": s.bytes, "reference_reductions": calls[0], "steps": 3,
            "grad_bytes": sum(p.numel() * p.element_size() for p in grads),
            "duration_count": s.duration_count, "inflight": s.inflight,
            "wait_seconds": gradient_sync(model).wait_seconds,
            "blocked_seconds": gradient_sync(model).blocked_seconds}


def strict_bf16(rank: int) -> dict:
    """hccl-strict, bf16: npudist.ddp against DDP with the float32 reference hook."""
    comm.set_profile("hccl-strict")
    try:
        calls = [0]
        with small_first_bucket():
            ref = DDP(build(torch.bfloat16), bucket_cap_mb=SMALL_BUCKET_MB)
        ref.register_comm_hook(calls, fp32_reference)
        train(ref, rank, torch.bfloat16, steps=8, lr=0.05)
        with small_first_bucket():
            mine = npudist.ddp(build(torch.bfloat16), bucket_cap_mb=SMALL_BUCKET_MB)
        comm.reset_stats()
        losses = train(mine, rank, torch.bfloat16, steps=8, lr=0.05)
        kinds = comm.stats().get("all_reduce").adaptations
    finally:
        comm.set_profile(None)
    return {"differ": same_bits(params(ref), params(mine)), "losses": losses, "reference_reductions": calls[0],
            "adaptations": kinds, "buckets": gradient_sync(mine).buckets}


def start_sync(rank: int) -> dict:
    """Ranks start with different bf16 weights under hccl-strict: npudist.ddp copies rank 0's, through
    npudist's broadcast (the row takes no bf16, so each copy is adapted)."""
    comm.set_profile("hccl-strict")
    try:
        torch.manual_seed(100 + rank)
        model = Net().to(torch.bfloat16)
        torch.manual_seed(100)
        rank0 = Net().to(torch.bfloat16)  # what rank 0 built
        comm.reset_stats()
        mine = npudist.ddp(model)
        s = comm.stats().get("broadcast")
    finally:
        comm.set_profile(None)
    return {"differ": same_bits(params(rank0), params(mine)), "broadcasts": s.calls if s else 0,
            "tensors": len(list(rank0.parameters())) + len(list(rank0.buffers())),
            "adapted": sum(s.adaptations.values()) if s else 0}


def refusals() -> dict[str, str]:
    """Options that cannot go through a comm hook: each raises before any communication."""
    from torch.nn.parallel.distributed import _MixedPrecision

    out = {}
    for name, call in {
        "mixed_precision": lambda: npudist.ddp(build(torch.float32), mixed_precision=_MixedPrecision()),
        "delay": lambda: npudist.ddp(build(torch.float32), delay_all_reduce_named_params=[],
                                     param_to_hook_all_reduce=None),
        "sparse": lambda: npudist.ddp(nn.Sequential(nn.Embedding(10, 4, sparse=True))),
    }.items():
        try:
            call()
            out[name] = "no error"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def replaced_hook(rank: int) -> dict:
    """A user's register_comm_hook replaces npudist's, with one warning however often it is called."""
    mine = npudist.ddp(build(torch.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mine.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
        mine.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    comm.reset_stats()
    train(mine, rank, torch.float32)
    plain = DDP(build(torch.float32))
    train(plain, rank, torch.float32)
    s = comm.stats().get("all_reduce")
    return {"warnings": [str(w.message) for w in caught], "npudist_calls": s.calls if s else 0,
            "differ": same_bits(params(plain), params(mine))}


def hang(ctx: npudist.DistContext, run_dir: str) -> None:
    comm.set_run_dir(run_dir)
    model = npudist.ddp(build(torch.float32))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch(ctx.rank, torch.float32)
    for step in range(1, 4):
        loss = F.mse_loss(model(x), y)
        if step == 3 and ctx.rank == ctx.world_size - 1:
            time.sleep(120)  # stuck (a data loader, a dead device): the others must not wait for this
        start = time.monotonic()
        try:
            loss.backward()
        except Exception as exc:
            print(f"RANK {ctx.rank} RAISED {type(exc).__name__} after {time.monotonic() - start:.1f} s: {exc}",
                  flush=True)
            raise
        opt.step()
        opt.zero_grad()


def main() -> None:
    out_dir = sys.argv[1]
    ctx = npudist.init()
    result: dict = {"rank": ctx.rank, "world": ctx.world_size}
    if ctx.world_size == 2:
        result["default"] = default_vs_plain(ctx.rank)
        result["accounting"] = accounting(ctx.rank)
        result["refusals"] = refusals()
        result["replaced"] = replaced_hook(ctx.rank)
    else:  # 1/3 is inexact: the hook must scale before the sum, as DDP does, to keep DDP's bits
        result["default"] = default_vs_plain(ctx.rank, only=("defaults", "bucket_cap_mb"))
    if compat.has("gloo_bf16"):  # plain DDP of a bf16 model is the reference
        result["strict"] = strict_bf16(ctx.rank)
    if compat.has("ddp_init_sync"):
        result["start_sync"] = start_sync(ctx.rank)
    with open(f"{out_dir}/rank{ctx.rank}.json", "w") as f:
        json.dump(result, f)
    if sys.argv[2:] == ["hang"]:
        hang(ctx, out_dir)
    npudist.shutdown()


if __name__ == "__main__":
    main()
