"""Chunked all_reduce for tensors that must be copied (cast, padded, staged) before the library sees them.

A plain adapted call copies the whole tensor into the work buffer, reduces it, then copies it all back,
so both copies add to the wall time (bf16 -> fp32 -> bf16 of 8.4 M elements is about 15 ms single
threaded, half of the fp32 transfer itself). Here the buffer is cut into a few chunks: chunk k+1 is
copied in while chunk k is on the wire (async collectives run on the backend's own threads), and chunk
k is copied back while the later chunks are still reducing. Only the first copy-in and the last
copy-out stay visible. That needs a core that is idle during the transfer: with two ranks on two
shared cores gloo keeps each core ~76 % busy and the chunking measured no gain over one chunk
(benchmarks/strict_bf16.py); it is kept for hosts with free cores and for devices, where the casts
run on the accelerator (not measured).

Each chunk is its own library call, so every chunk honours the row's element multiple and alignment.
The result is the same element for element: a reduction is elementwise, and the work dtype is unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from npudist.comm.plan import Plan, neutral

MIN_BYTES = 4 * 2**20
"""Caller payloads below this take the one-shot path: per-call overhead would outweigh the overlap."""
CHUNKS = 6
"""Chunks per call: more hides more of the copies but costs a library call each."""


def chunk_bounds(total: int, chunks: int, unit: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` pieces covering ``range(total)``, at most ``chunks`` of them, every ``lo`` a multiple of
    ``unit`` (so each piece starts aligned and, when ``total`` is a multiple of ``unit``, has a length
    that is one too)."""
    if total <= 0:
        return []
    if chunks < 1 or unit < 1:
        raise ValueError(f"chunk_bounds needs chunks >= 1 and unit >= 1, got chunks={chunks} unit={unit}")
    step = -(-total // chunks)
    step = -(-step // unit) * unit
    return [(lo, min(lo + step, total)) for lo in range(0, total, step)]


def chunk_unit(element_multiple: int, alignment_bytes: int, itemsize: int) -> int:
    """Smallest chunk length (elements) that keeps both the element multiple and the byte alignment."""
    per_align = max(alignment_bytes // math.gcd(alignment_bytes, itemsize), 1)
    return math.lcm(max(element_multiple, 1), per_align)


def eligible(plan: Plan, t: torch.Tensor, nbytes: int, async_op: bool) -> bool:
    """Worth chunking: a synchronous, contiguous, large call that needs a copy anyway."""
    return (plan.copy and not async_op and not plan.reinterpret and nbytes >= MIN_BYTES
            and t.is_contiguous())


def all_reduce_chunked(t: torch.Tensor, buf: torch.Tensor, op: str, native: object, plan: Plan,
                       group: object | None, world: int, unit: int, chunks: int = CHUNKS) -> None:
    """Reduce contiguous ``t`` through ``buf`` (work dtype, ``plan.padded_chunk`` elements) chunk by chunk."""
    src = t.view(-1)
    n = src.numel()
    bounds = chunk_bounds(plan.padded_chunk, chunks, unit)
    works = []
    for lo, hi in bounds:
        top = min(hi, n)
        if lo < top:
            buf[lo:top].copy_(src[lo:top])
        if hi > n:
            buf[max(lo, n):hi].fill_(neutral(op, plan.work_dtype))
        works.append(dist.all_reduce(buf[lo:hi], op=native, group=group, async_op=True))
    for (lo, hi), work in zip(bounds, works, strict=True):
        work.wait()
        top = min(hi, n)
        if lo < top:
            part = buf[lo:top]
            if plan.divide:
                part.div_(world)
            src[lo:top].copy_(part)
