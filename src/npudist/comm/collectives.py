"""all_reduce, broadcast, all_gather and reduce_scatter that adapt to the active constraints.

Each call checks the tensor against the active row (constraints.py); when nothing needs adapting it
calls torch.distributed directly (the fast path). Otherwise it copies into a pooled, aligned, padded
scratch buffer of the dtype the backend accepts, runs the collective there, and writes the result
back into the caller's tensor, so shape, dtype, strides and storage stay the caller's own.

Result rule, for tests and users: the answer equals a plain reduction computed in the plan's work
dtype (the caller's dtype, or the narrowest wider one the backend accepts) and cast back once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
import torch.distributed as dist

from npudist.comm import context, handshake, pipeline
from npudist.comm.buffers import Lease, aligned_empty, pinning_available
from npudist.comm.flat_gather import all_gather_flat
from npudist.comm.plan import Plan, TensorFacts, neutral, plan_copy, plan_reduce
from npudist.runtime import compat

R = dist.ReduceOp
OPS: Mapping[str, object] = MappingProxyType({
    "sum": R.SUM, "avg": R.AVG, "max": R.MAX, "min": R.MIN, "product": R.PRODUCT, "band": R.BAND, "bor": R.BOR,
    "bxor": R.BXOR})
# torch 2.13 renamed the flat-tensor collectives (*_into_tensor / *_tensor are deprecated there);
# older torch (>= 2.1, what torch_npu users are tied to) has only the old names.
ALL_GATHER = all_gather_flat
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_CPU = torch.device("cpu")
_clock = time.perf_counter


def _check_op(op: str) -> object:
    try:
        return OPS[op]
    except KeyError:
        raise ValueError(f"unknown reduce op {op!r}; choose one of {', '.join(OPS)}") from None


def _check_tensor(name: str, t: object) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} expects a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{name} expects a dense tensor, got layout {t.layout}; call .to_dense() first")


class _Call:
    """One collective as its exits account for it: which op, on which group, since when (``_clock()``), and
    whether it is counted (False where the caller accounts for itself: all_reduce_many's buckets). Built
    on every call of the adapted paths, so a slotted class (cheaper to build than a NamedTuple or a
    frozen dataclass); nothing changes it after construction."""

    __slots__ = ("ctx", "op", "record", "start")

    def __init__(self, op: str, ctx: context.GroupContext, start: float, record: bool = True) -> None:
        self.op, self.ctx, self.start, self.record = op, ctx, start, record


class Handle:
    """What an async collective returns: ``wait()`` (or the future of ``get_future()``) finishes the
    post-processing and the accounting, exactly once."""

    __slots__ = ("_call", "_done", "_error", "_finish", "_future", "_kinds", "_nbytes", "_on_done", "_record",
                 "_work", "result", "seconds")

    def __init__(self, call: _Call, result: torch.Tensor, *, work: object | None,
                 finish: Callable[[], None] | None = None, nbytes: int = 0, kinds: tuple[str, ...] = ()) -> None:
        self._call, self._work, self._finish, self.result = call, work, finish, result
        ctx = call.ctx
        self._record = call.record and ctx.recorder.enabled
        self._nbytes, self._kinds = nbytes, kinds
        self._done = False
        self._future: torch.futures.Future | None = None
        self._on_done: Callable[[], None] | None = None
        self._error: BaseException | None = None
        self.seconds: float | None = None
        """Issue to completion, once finished (what a DDP step spent on this bucket)."""
        if call.record:
            ctx.recorder.inflight(call.op, ctx.backend, 1)

    def is_completed(self) -> bool:
        return self._done or self._work is None or bool(self._work.is_completed())

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (the process group's timeout applies unless ``timeout`` seconds is given)."""
        if self._future is not None:  # get_future() owns completion: wait for it, then report its outcome
            try:
                self._future.wait()
            except Exception:  # the callback kept the collective's own error in _error
                if self._error is None:
                    raise
            if self._error is not None:
                raise self._error
            return True
        if self._done:
            return True
        try:
            if self._work is not None:
                if timeout is None:
                    self._work.wait()
                else:
                    from datetime import timedelta

                    self._work.wait(timedelta(seconds=timeout))
        except BaseException:
            self._settle(False)
            raise
        self._settle(True)
        return True

    def get_future(self, on_done: Callable[[], None] | None = None) -> torch.futures.Future:
        """A Future that completes with ``result`` once the collective, its post-processing and its
        accounting are done (what a DDP comm hook returns), after calling ``on_done()`` if given. Its
        callback runs on the backend's thread."""
        if self._future is None:
            self._on_done = on_done
            if self._work is None:  # nothing in flight (an empty tensor): complete it now
                self.wait()
                if on_done is not None:
                    on_done()
                self._future = torch.futures.Future()
                self._future.set_result(self.result)
            else:
                self._future = self._work.get_future().then(self._completed)
        return self._future

    def _completed(self, fut: torch.futures.Future) -> torch.Tensor:
        # The work's own wait() must not be called here: backends complete the future before the work.
        try:
            fut.value()
        except BaseException as exc:
            self._error = exc
            self._settle(False)
            raise
        self._settle(True, shared=True)
        if self._on_done is not None:
            self._on_done()
        return self.result

    def _settle(self, ok: bool, shared: bool = False) -> None:
        """Post-process and account for a finished collective (``ok``) or a failed one, once."""
        if self._done:
            return
        self._done = True
        try:
            if ok and self._finish is not None:
                self._finish()
        finally:
            if self._record:
                self._call.ctx.recorder.inflight(self._call.op, self._call.ctx.backend, -1)
        self.seconds = _clock() - self._call.start
        if ok and self._record:
            _record_done(self._call.ctx, self._call.op, self._nbytes, start=self._call.start, kinds=self._kinds,
                         shared=shared)


def _record_done(ctx: context.GroupContext, op: str, nbytes: int, *, start: float, kinds: tuple[str, ...],
                 shared: bool = False) -> None:
    """Account one finished call (``shared``: from a backend thread, where completions can overlap)."""
    if ctx.sync_timing and ctx.device_type != "cpu":
        getattr(torch, ctx.device_type).synchronize()
    recorder = ctx.recorder
    (recorder.record_shared if shared else recorder.record)(op, ctx.backend, nbytes, _clock() - start, kinds)


def _complete(call: _Call, result: torch.Tensor, *, work: object | None = None,
              finish: Callable[[], None] | None = None, nbytes: int = 0, kinds: tuple[str, ...] = (),
              async_op: bool = False) -> torch.Tensor | Handle:
    """Every exit of a collective: ``result`` now (after ``finish``, accounted), or a Handle that does
    both when ``work`` is waited for."""
    if async_op:
        return Handle(call, result, work=work, finish=finish, nbytes=nbytes, kinds=kinds)
    # A synchronous call is finished here; it never counts as in flight.
    if finish is not None:
        finish()
    if call.record and call.ctx.recorder.enabled:
        _record_done(call.ctx, call.op, nbytes, start=call.start, kinds=kinds)
    return result


def _lease(plan: Plan, numel: int, device: torch.device, ctx: context.GroupContext) -> Lease:
    dev = _CPU if plan.stage else device
    pin = plan.stage and pinning_available(device)
    return ctx.pool.acquire(numel, plan.work_dtype, dev, ctx.constraints.alignment_bytes, pin)


def _caller_view(buf: torch.Tensor, plan: Plan, t: torch.Tensor) -> torch.Tensor:
    """The first chunk of ``buf`` seen with the caller's dtype and shape (bytes reinterpreted if needed)."""
    if plan.reinterpret:
        nbytes = t.numel() * t.element_size()
        return buf.view(torch.uint8)[:nbytes].view(t.dtype).view(t.shape)
    return buf[: t.numel()].view(t.shape)


def _debug(op: str, t: torch.Tensor, group: object | None, ctx: context.GroupContext) -> None:
    device = _CPU if not ctx.constraints.device_tensors else t.device
    handshake.check(op, t.numel(), t.dtype, tuple(t.shape), group, ctx.world, device)


def all_reduce(t: torch.Tensor, op: str = "sum", group: object | None = None,
               async_op: bool = False, *, _record: bool = True) -> torch.Tensor | Handle:
    """Reduce ``t`` across ranks in place and return it (or a Handle when ``async_op``)."""
    start = _clock()
    ctx = context.get(group)
    c = ctx.constraints
    native = _check_op(op)
    _check_tensor("all_reduce", t)
    if t.dtype in ctx.fast_reduce.get(op, ()) and (not c.contiguous or t.is_contiguous()):
        # Fast path: nothing to adapt, hand the tensor straight to torch.distributed. Kept to a set
        # lookup, the call and a few integer adds: it is the whole cost of small one-by-one reductions.
        work = dist.all_reduce(t, op=native, group=group, async_op=async_op)
        if async_op:
            return Handle(_Call("all_reduce", ctx, start, _record), t, work=work, nbytes=t.numel() * t.element_size())
        if _record and ctx.recorder.enabled:
            _record_done(ctx, "all_reduce", t.numel() * t.element_size(), start=start, kinds=())
        return t
    n = t.numel()
    plan = plan_reduce(c, op, TensorFacts.of(t), backend=ctx.backend)
    if ctx.debug:
        _debug("all_reduce", t, group, ctx)
    nbytes = n * t.element_size()
    call = _Call("all_reduce", ctx, start, _record)
    if n == 0:
        return _complete(call, t, kinds=plan.kinds, async_op=async_op)
    native = OPS[plan.native_op]
    world = ctx.world
    if not plan.copy:
        work = dist.all_reduce(t, op=native, group=group, async_op=async_op)
        finish = (lambda: t.div_(world)) if plan.divide else None
        return _complete(call, t, work=work, finish=finish, nbytes=nbytes, kinds=plan.kinds, async_op=async_op)
    lease = _lease(plan, plan.padded_chunk, t.device, ctx)
    buf = lease.tensor
    if pipeline.eligible(plan, t, nbytes, async_op):
        try:
            unit = pipeline.chunk_unit(c.element_multiple, c.alignment_bytes, buf.element_size())
            pipeline.all_reduce_chunked(t, buf, op, native, plan, group, world, unit)
        finally:
            ctx.pool.release(lease)
        return _complete(call, t, nbytes=nbytes, kinds=plan.kinds)
    body = buf[:n]
    body.view(t.shape).copy_(t)
    if plan.padded_chunk != n:
        buf[n:].fill_(neutral(op, plan.work_dtype))
    work = dist.all_reduce(buf, op=native, group=group, async_op=async_op)

    def finish() -> None:
        if plan.divide:
            body.div_(world)
        t.copy_(body.view(t.shape))
        ctx.pool.release(lease)

    return _complete(call, t, work=work, finish=finish, nbytes=nbytes, kinds=plan.kinds, async_op=async_op)


def broadcast(t: torch.Tensor, src: int = 0, group: object | None = None,
              async_op: bool = False) -> torch.Tensor | Handle:
    """Overwrite ``t`` on every rank with rank ``src``'s tensor (global rank, as torch.distributed)."""
    start = _clock()
    ctx = context.get(group)
    c = ctx.constraints
    _check_tensor("broadcast", t)
    n = t.numel()
    nbytes = n * t.element_size()
    plan = plan_copy(c, TensorFacts.of(t), backend=ctx.backend)
    if ctx.debug:
        _debug("broadcast", t, group, ctx)
    call = _Call("broadcast", ctx, start)
    if n == 0:
        return _complete(call, t, kinds=plan.kinds, async_op=async_op)
    if not plan.copy:
        work = dist.broadcast(t, src=src, group=group, async_op=async_op)
        return _complete(call, t, work=work, nbytes=nbytes, async_op=async_op)
    lease = _lease(plan, plan.padded_chunk, t.device, ctx)
    is_src = dist.get_rank() == src
    if is_src:
        _caller_view(lease.tensor, plan, t).copy_(t)
    work = dist.broadcast(lease.tensor, src=src, group=group, async_op=async_op)

    def finish() -> None:
        if not is_src:
            t.copy_(_caller_view(lease.tensor, plan, t))
        ctx.pool.release(lease)

    return _complete(call, t, work=work, finish=finish, nbytes=nbytes, kinds=plan.kinds, async_op=async_op)


def _output(numel: int, dtype: torch.dtype, device: torch.device, alignment: int) -> torch.Tensor:
    if alignment > 64:
        return aligned_empty(numel, dtype, device, alignment)
    return torch.empty(numel, dtype=dtype, device=device)


def all_gather(t: torch.Tensor, group: object | None = None, async_op: bool = False) -> torch.Tensor | Handle:
    """Every rank's ``t`` stacked: a new tensor of shape ``[world, *t.shape]``."""
    start = _clock()
    ctx = context.get(group)
    c = ctx.constraints
    _check_tensor("all_gather", t)
    n, world = t.numel(), ctx.world
    nbytes = n * t.element_size()
    plan = plan_copy(c, TensorFacts.of(t), backend=ctx.backend)
    if ctx.debug:
        _debug("all_gather", t, group, ctx)
    call = _Call("all_gather", ctx, start)
    if n == 0:
        out = torch.empty((world, *t.shape), dtype=t.dtype, device=t.device)
        return _complete(call, out, kinds=plan.kinds, async_op=async_op)
    if not plan.copy:
        flat = _output(world * n, t.dtype, t.device, c.alignment_bytes)
        work = ALL_GATHER(flat, t.reshape(-1), group=group, async_op=async_op)
        out = flat.view(world, *t.shape)
        return _complete(call, out, work=work, nbytes=nbytes, async_op=async_op)
    per = plan.padded_chunk
    src = _lease(plan, per, t.device, ctx)
    dst = _lease(plan, world * per, t.device, ctx)
    _caller_view(src.tensor, plan, t).copy_(t)
    work = ALL_GATHER(dst.tensor, src.tensor, group=group, async_op=async_op)
    out = torch.empty((world, *t.shape), dtype=t.dtype, device=t.device)

    def finish() -> None:
        rows = dst.tensor.view(world, per)
        rows = rows.view(torch.uint8)[:, :nbytes].view(t.dtype) if plan.reinterpret else rows[:, :n]
        out.copy_(rows.reshape(world, *t.shape) if t.dim() == 0 else rows.view(world, *t.shape))
        ctx.pool.release(src)
        ctx.pool.release(dst)

    return _complete(call, out, work=work, finish=finish, nbytes=nbytes, kinds=plan.kinds, async_op=async_op)


def _gloo_reduce_scatter_unsound(backend: str, op: str) -> bool:
    """gloo's reduce_scatter_tensor is missing on torch 2.1 and returns wrong MIN/MAX/PRODUCT values on
    2.5.1 and 2.8.0 (measured, issue 33; right from 2.11): there it is emulated with all_reduce."""
    return backend == "gloo" and (not compat.has("gloo_reduce_scatter")
                                  or (op in ("min", "max", "product") and not compat.has("gloo_reduce_scatter_minmax")))


def reduce_scatter(t: torch.Tensor, op: str = "sum", group: object | None = None,
                   async_op: bool = False) -> torch.Tensor | Handle:
    """Reduce ``t`` across ranks and return this rank's slice of dim 0 (``t.shape[0] // world`` rows)."""
    start = _clock()
    ctx = context.get(group)
    c = ctx.constraints
    native = _check_op(op)
    _check_tensor("reduce_scatter", t)
    world = ctx.world
    if t.dim() == 0 or t.shape[0] % world:
        raise ValueError(
            f"reduce_scatter: the first dimension of a tensor of shape {list(t.shape)} must be divisible by "
            f"the world size {world}; pad or reshape it so each rank gets an equal share"
        )
    n = t.numel()
    rows = t.shape[0] // world
    out_shape = (rows, *t.shape[1:])
    nbytes = n * t.element_size()
    plan = plan_reduce(c, op, TensorFacts.of(t), chunks=world, backend=ctx.backend)
    call = _Call("reduce_scatter", ctx, start)
    if _gloo_reduce_scatter_unsound(ctx.backend, op):
        # All ranks reduce the whole tensor and keep their slice: world times the traffic, right values.
        full = t.detach().clone()
        all_reduce(full, op=op, group=group)
        out = full.reshape(world, rows, *t.shape[1:])[ctx.rank].clone()
        return _complete(call, out, nbytes=nbytes, kinds=plan.kinds, async_op=async_op)
    if ctx.debug:
        _debug("reduce_scatter", t, group, ctx)
    k = plan.chunk
    if n == 0:
        out = torch.empty(out_shape, dtype=t.dtype, device=t.device)
        return _complete(call, out, kinds=plan.kinds, async_op=async_op)
    native = OPS[plan.native_op]
    if not plan.copy:
        flat = _output(k, t.dtype, t.device, c.alignment_bytes)
        work = REDUCE_SCATTER(flat, t.reshape(-1), op=native, group=group, async_op=async_op)
        finish = (lambda: flat.div_(world)) if plan.divide else None
        return _complete(call, flat.view(out_shape), work=work, finish=finish, nbytes=nbytes, kinds=plan.kinds,
                         async_op=async_op)
    kp = plan.padded_chunk
    src = _lease(plan, world * kp, t.device, ctx)
    dst = _lease(plan, kp, t.device, ctx)
    chunks = src.tensor.view(world, kp)
    chunks[:, :k].view(world, rows, *t.shape[1:]).copy_(t.unflatten(0, (world, rows)))
    if kp != k:
        chunks[:, k:].fill_(neutral(op, plan.work_dtype))
    work = REDUCE_SCATTER(dst.tensor, src.tensor, op=native, group=group, async_op=async_op)
    out = torch.empty(out_shape, dtype=t.dtype, device=t.device)

    def finish() -> None:
        body = dst.tensor[:k]
        if plan.divide:
            body.div_(world)
        out.copy_(body.view(out_shape))
        ctx.pool.release(src)
        ctx.pool.release(dst)

    return _complete(call, out, work=work, finish=finish, nbytes=nbytes, kinds=plan.kinds, async_op=async_op)
