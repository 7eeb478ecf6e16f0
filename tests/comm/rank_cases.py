"""Runs inside each rank: executes a list of collective cases and writes what it saw as JSON.

Started once per world size by test_collectives.py (starting ranks costs seconds, cases cost ms).
Every rank builds every rank's input from the case seed, so it can compute the reference locally.
"""

from __future__ import annotations

import json
import sys

import torch

import npudist
from npudist import comm

NAMES = ("float32", "float16", "bfloat16", "float64", "int16", "int32", "int64", "uint8", "bool")
DTYPES = {n: getattr(torch, n) for n in NAMES}
# Reference rule: reduce in the dtype the backend reduces in, then cast back once. Written by hand
# from the profile rows: hccl-strict reduces bf16 in float32; gloo reduces int16 in int32.
WORK = {("hccl-strict", "bfloat16"): torch.float32, ("gloo", "int16"): torch.int32}


def values(case: dict, rank: int, shape: list[int]) -> torch.Tensor:
    g = torch.Generator().manual_seed(case["seed"] * 131 + rank)
    dtype = DTYPES[case["dtype"]]
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    lo, hi = (-2, 3) if case["redop"] == "product" else (-5, 6)
    if dtype == torch.uint8:
        lo, hi = 0, hi
    # Small integers: every sum and product here is exact in every dtype, whatever order the
    # backend adds in, so the comparison can be bit for bit.
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def viewed(case: dict, base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(storage owner, the view the collective gets) for the case's view kind."""
    kind, shape = case["view"], base.shape
    # Never share storage with the inputs the reference is computed from (contiguous() can return self).
    base = base.clone()
    if kind == "transpose" and base.dim() >= 2:
        owner = base.transpose(-1, -2).contiguous()
        return owner, owner.transpose(-1, -2)
    if kind == "step" and base.dim() >= 1:
        owner = torch.zeros((shape[0] * 2, *shape[1:]), dtype=base.dtype)
        owner[::2] = base
        owner[1::2] = 1 if base.dtype != torch.bool else True
        return owner, owner[::2]
    if kind == "offset":
        owner = torch.zeros(base.numel() + 1, dtype=base.dtype)
        owner[1:] = base.reshape(-1)
        return owner, owner[1:].view(shape)
    owner = base.clone()
    return owner, owner


def reduce(xs: list[torch.Tensor], redop: str) -> torch.Tensor:
    acc = xs[0].clone()
    for y in xs[1:]:
        if redop in ("sum", "avg"):
            acc = acc | y if acc.dtype == torch.bool else acc + y
        elif redop == "product":
            acc = acc & y if acc.dtype == torch.bool else acc * y
        elif redop == "max":
            acc = torch.maximum(acc, y)
        elif redop == "min":
            acc = torch.minimum(acc, y)
        elif redop == "band":
            acc = acc & y
    if redop == "avg":
        acc = acc / len(xs)
    return acc


def run_case(case: dict, rank: int, world: int) -> dict:
    comm.set_profile(case["profile"])
    dtype = DTYPES[case["dtype"]]
    shape = list(case["shape"])
    if case["coll"] == "reduce_scatter":
        shape = [shape[0] * world if shape else world, *shape[1:]]
    inputs = [values(case, r, shape) for r in range(world)]
    owner, t = viewed(case, inputs[rank])
    before_owner = owner.clone()
    ptr, stride = t.data_ptr(), t.stride()
    work = WORK.get((case["profile"], case["dtype"]), dtype)
    try:
        if case["coll"] == "all_reduce":
            out = comm.all_reduce(t, case["redop"])
            assert out is t
            expected = reduce([x.to(work) for x in inputs], case["redop"]).to(dtype)
        elif case["coll"] == "reduce_scatter":
            out = comm.reduce_scatter(t, case["redop"])
            full = reduce([x.to(work) for x in inputs], case["redop"]).to(dtype)
            expected = full.chunk(world, 0)[rank]
        elif case["coll"] == "all_gather":
            out = comm.all_gather(t)
            expected = torch.stack(inputs)
        else:
            out = comm.broadcast(t, src=case["src"] % world)
            expected = inputs[case["src"] % world]
    except (TypeError, ValueError) as exc:
        return {"id": case["id"], "error": f"{type(exc).__name__}: {exc}"}
    problems = []
    if out.dtype != dtype or list(out.shape) != list(expected.shape):
        problems.append(f"got {out.dtype} {list(out.shape)}, want {dtype} {list(expected.shape)}")
    elif not torch.equal(out, expected):
        got, want = out.flatten()[:8].tolist(), expected.flatten()[:8].tolist()
        problems.append(f"values differ: got {got}, want {want}")
    if case["coll"] in ("all_reduce", "broadcast"):
        if (t.data_ptr(), t.stride()) != (ptr, stride):
            problems.append("the caller's view moved")
        # Storage outside the view must be untouched.
        if case["view"] == "step" and t.dim() >= 1:
            mask = torch.zeros_like(owner, dtype=torch.bool)
            mask[1::2] = True
        elif case["view"] == "offset":
            mask = torch.zeros_like(owner, dtype=torch.bool)
            mask[0] = True
        else:
            mask = torch.zeros_like(owner, dtype=torch.bool)
        if not torch.equal(owner[mask], before_owner[mask]):
            problems.append("storage outside the view changed")
    return {"id": case["id"], "ok": not problems, "problems": problems}


def main() -> None:
    cases_path, out_dir = sys.argv[1], sys.argv[2]
    ctx = npudist.init()
    with open(cases_path) as f:
        spec = json.load(f)
    results = [run_case(c, ctx.rank, ctx.world_size) for c in spec["cases"]]
    checks = run_checks(ctx.rank, ctx.world_size)
    with open(f"{out_dir}/rank{ctx.rank}.json", "w") as f:
        json.dump({"results": results, "checks": checks}, f)
    npudist.shutdown()


def run_checks(rank: int, world: int) -> dict:
    """Adaptation counts and in-flight accounting for hand-picked tensors."""
    out: dict = {}
    comm.set_profile("hccl-strict")
    comm.reset_stats()
    comm.all_reduce(torch.ones(256, dtype=torch.bfloat16))
    out["strict_bf16"] = comm.stats().get("all_reduce").adaptations
    comm.reset_stats()
    comm.all_reduce(torch.ones(130, 2).t())  # strided, 260 elements
    out["strict_strided_odd"] = comm.stats().get("all_reduce").adaptations
    comm.reset_stats()
    owner = torch.ones(128 + 32 + 1)
    start = next(i for i in range(1, 33) if owner[i:].data_ptr() % 128)  # a misaligned start
    comm.all_reduce(owner[start:start + 128])
    out["strict_misaligned"] = comm.stats().get("all_reduce").adaptations
    comm.set_profile("gloo")
    comm.reset_stats()
    comm.all_reduce(torch.ones(10, dtype=torch.int16))
    out["gloo_int16"] = comm.stats().get("all_reduce").adaptations
    comm.reset_stats()
    t = torch.ones(1000)
    handle = comm.all_reduce(t, async_op=True)
    out["inflight_before_wait"] = comm.stats().get("all_reduce").inflight
    handle.wait()
    s = comm.stats().get("all_reduce")
    out["after_wait"] = [s.inflight, s.calls, s.bytes, t[0].item()]
    # all_reduce_many: same layout twice -> one build; answers in place, avg emulated under strict.
    from npudist.comm.state import state

    comm.set_profile("hccl-strict")
    before = state().layouts.builds
    for _ in range(2):
        grads = [torch.full((3, 5), float(rank + 1), dtype=torch.bfloat16), torch.full((7,), float(rank)),
                 torch.full((4, 2), float(rank), dtype=torch.float32).t()]
        comm.all_reduce_many(grads, op="avg", bucket_bytes=64)
    out["many_builds"] = state().layouts.builds - before
    out["many_values"] = [grads[0][0, 0].item(), grads[1][0].item(), grads[2][0, 0].item(), grads[2].stride()]
    comm.set_profile(None)
    return out


if __name__ == "__main__":
    main()
