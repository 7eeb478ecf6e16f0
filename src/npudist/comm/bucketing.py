"""all_reduce_many: many tensors reduced in a few flat buckets instead of one collective each.

Tensors of the same dtype and device are packed, in order, into buckets of at most ``bucket_bytes``;
each bucket is one async all_reduce, packed while the previous one is on the wire, then unpacked into
the callers' tensors. Bucket buffers (already cast, padded and aligned as the active constraints ask)
are kept per layout (the CommState's LayoutCache), so a training loop allocates them on its first step only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from npudist.comm import context, handshake
from npudist.comm.buffers import aligned_empty, pinning_available
from npudist.comm.collectives import OPS, _check_op, _check_tensor, all_reduce
from npudist.comm.plan import Plan, TensorFacts, neutral, plan_reduce
from npudist.comm.state import state

DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb


@dataclass
class _Bucket:
    indices: list[int]
    plan: Plan
    direct: bool
    """One tensor that needs no adaptation: reduced in place, no buffer."""
    flat: torch.Tensor | None = None
    views: list[torch.Tensor] | None = None


def _split(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    groups: dict[tuple, list[list[int]]] = {}
    sizes: dict[tuple, int] = {}
    order: list[tuple] = []
    for i, t in enumerate(tensors):
        key = (t.dtype, t.device)
        nbytes = t.numel() * t.element_size()
        if key not in groups:
            groups[key], sizes[key] = [[]], 0
            order.append(key)
        if groups[key][-1] and sizes[key] + nbytes > bucket_bytes:
            groups[key].append([])
            sizes[key] = 0
        groups[key][-1].append(i)
        sizes[key] += nbytes
    return [b for key in order for b in groups[key]]


def _build(tensors: Sequence[torch.Tensor], op: str, bucket_bytes: int,
           ctx: context.GroupContext) -> list[_Bucket]:
    c = ctx.constraints
    buckets = []
    for indices in _split(tensors, bucket_bytes):
        first = tensors[indices[0]]
        numel = sum(tensors[i].numel() for i in indices)
        if len(indices) == 1:
            plan = plan_reduce(c, op, TensorFacts(first.dtype, numel, first.is_contiguous(), first.data_ptr(),
                                                  first.device.type), backend=ctx.backend)
            if not plan.copy:
                buckets.append(_Bucket(indices, plan, direct=True))
                continue
        # A fresh flat buffer is contiguous and aligned: only cast, pad and stage can remain.
        plan = plan_reduce(c, op, TensorFacts(first.dtype, numel, device_type=first.device.type), backend=ctx.backend)
        device = torch.device("cpu") if plan.stage else first.device
        pin = plan.stage and pinning_available(first.device)
        flat = aligned_empty(plan.padded_chunk, plan.work_dtype, device, max(c.alignment_bytes, 64), pin)
        if plan.padded_chunk != numel:
            # Padding holds the op's neutral value, which every reduction maps to itself: fill once.
            flat[numel:].fill_(neutral(op, plan.work_dtype))
        views, offset = [], 0
        for i in indices:
            t = tensors[i]
            views.append(flat[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()
        buckets.append(_Bucket(indices, plan, direct=False, flat=flat, views=views))
    return buckets


def _copy_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    foreach = getattr(torch, "_foreach_copy_", None)  # one dispatch for the whole list where torch has it
    if foreach is not None:
        foreach(dst, src)
    else:  # pragma: no cover - torch < 2.1
        for d, s in zip(dst, src, strict=True):
            d.copy_(s)


def all_reduce_many(tensors: Sequence[torch.Tensor], op: str = "sum",
                    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                    group: object | None = None) -> list[torch.Tensor]:
    """Reduce every tensor in place, a bucket at a time; returns the same tensors as a list.

    Every rank must pass tensors of the same shapes, dtypes and order (gradients of the same model).
    """
    start = time.perf_counter()
    ctx = context.get(group)
    _check_op(op)
    tensors = list(tensors)
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    for t in tensors:
        _check_tensor("all_reduce_many", t)
    if not tensors:
        return tensors
    # Buffers depend on the tensors' layout, not on where they live (a lone "direct" tensor that turns
    # out misaligned on a later call is adapted by all_reduce itself).
    layout = tuple((t.dtype, t.device, t.shape, t.stride()) for t in tensors)
    key = (op, bucket_bytes, ctx.constraints.name, layout)
    if ctx.debug:
        device = torch.device("cpu") if not ctx.constraints.device_tensors else tensors[0].device
        handshake.check("all_reduce_many", sum(t.numel() for t in tensors), tensors[0].dtype,
                        (len(tensors),), group, ctx.world, device)
    layouts = state().layouts
    buckets = layouts.acquire(key, lambda: _build(tensors, op, bucket_bytes, ctx))
    world = ctx.world
    kinds: list[str] = []
    nbytes = 0
    pending = []
    try:
        for b in buckets:
            kinds.extend(b.plan.kinds)
            nbytes += sum(tensors[i].numel() * tensors[i].element_size() for i in b.indices)
            if b.direct:
                # all_reduce takes its fast path (or adapts a tensor that moved); its handle divides.
                work = all_reduce(tensors[b.indices[0]], op, group, async_op=True, _record=False)
            else:
                _copy_all(b.views, [tensors[i] for i in b.indices])
                work = dist.all_reduce(b.flat, op=OPS[b.plan.native_op], group=group, async_op=True)
            ctx.recorder.inflight("all_reduce_many", ctx.backend, 1)
            pending.append((b, work))
        for b, work in pending:
            try:
                work.wait()
            finally:
                ctx.recorder.inflight("all_reduce_many", ctx.backend, -1)
            if b.direct:
                continue
            if b.plan.divide:
                b.flat[: sum(v.numel() for v in b.views)].div_(world)
            _copy_all([tensors[i] for i in b.indices], b.views)
    finally:
        layouts.release(key, buckets)
    ctx.recorder.record("all_reduce_many", ctx.backend, nbytes, time.perf_counter() - start, kinds)
    return tensors
