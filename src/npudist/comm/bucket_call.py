"""A DDP gradient bucket's all_reduce when nothing needs adapting: the plan made once per bucket layout.

The comm hook runs once per bucket per step on the thread that should be launching kernels, so what a
general collective works out on every call (the group's facts, the constraint row, the adaptation plan,
the reduce options) is worked out here when DDP shows a bucket buffer for the first time, and reused
while DDP keeps that buffer (it does until it rebuilds its buckets). The call itself is then numbered
for the hang watchdog, issued on the process group, and accounted for on completion, as every npudist
collective is; the completion work runs in the future's callback, on the backend's thread.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from npudist.comm.context import GroupContext
from npudist.comm.hang.watchdog import Watchdog
from npudist.comm.recorder import Recorder
from npudist.comm.watched import communication_failure
from npudist.runtime.compat import DIST_ERRORS

_clock = time.perf_counter
_OP = "all_reduce"
_WIDE_RANGE = frozenset({torch.float32, torch.float64, torch.bfloat16})


class BucketPlan:
    """What one bucket buffer's reductions need, fixed while DDP keeps the buffer."""

    __slots__ = ("buf", "counter", "ctx", "fast", "group", "lock", "nbytes", "opts", "post_scale", "scale")

    def __init__(self, buf: torch.Tensor, group: Any, ctx: GroupContext) -> None:
        self.buf, self.group, self.ctx = buf, group, ctx
        native = buf.dtype in ctx.constraints.native_dtypes("sum")
        # Fast: the backend's row takes the buffer as it is (no cast, pad, alignment, staging or debug
        # handshake) and no device synchronisation is asked for around the timing.
        self.fast = (native and buf.dtype in ctx.fast_reduce.get("sum", ()) and not buf.is_complex()
                     and not ctx.sync_timing)
        # DDP's default numerics: scale by 1/world first, then sum (a world of one has nothing to scale).
        # Where scaling is by a power of two it is exact for every normal number and so commutes with
        # each rounded addition: the sum scaled afterwards has the same bits (overflow and subnormals
        # aside, which is why float16, whose range a sum can leave, still scales first). Then the
        # scaling runs in the completion callback, on the backend's thread, not the training thread.
        world = ctx.world
        scale = 1.0 / world if native and world > 1 else None
        after = self.fast and scale is not None and world & (world - 1) == 0 and buf.dtype in _WIDE_RANGE
        self.scale, self.post_scale = (None, scale) if after else (scale, None)
        self.nbytes = buf.numel() * buf.element_size()
        self.opts = dist.AllreduceOptions()
        self.opts.reduceOp = dist.ReduceOp.SUM
        self.counter = ctx.recorder.counter(_OP, ctx.backend)
        self.lock = ctx.recorder.lock


class BucketCall:
    """One issued bucket reduction: ``future`` is what DDP waits on; ``wait()`` raises the hang diagnosis."""

    __slots__ = ("_plan", "_record", "_seq", "_start", "_watchdog", "error", "future", "seconds")

    def __init__(self, plan: BucketPlan, watchdog: Watchdog) -> None:
        self._plan, self._watchdog = plan, watchdog
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self._seq = watchdog.enter(_OP, plan.nbytes)
        self._record = plan.ctx.recorder.enabled
        if self._record:
            with plan.lock:
                plan.counter.inflight += 1
        self._start = _clock()
        try:
            work = plan.group.allreduce([plan.buf], plan.opts)
        except DIST_ERRORS as exc:
            self._settle()
            self.error = exc
            self._raise()
        self.future = work.get_future().then(self._completed)

    def _settle(self, ok: bool = False) -> None:
        plan = self._plan
        self.seconds = seconds = _clock() - self._start
        if not self._record:
            return
        with plan.lock:
            c = plan.counter
            c.inflight -= 1
            if ok:  # under the lock: completions run on backend threads, possibly two at once
                Recorder.add(c, plan.nbytes, seconds)

    def _completed(self, fut: torch.futures.Future) -> torch.Tensor:
        try:
            fut.value()
        except BaseException as exc:
            self.error = exc
            self._settle()
            raise
        plan = self._plan
        if plan.post_scale is not None:
            plan.buf.mul_(plan.post_scale)
        self._settle(True)
        self._watchdog.done(self._seq)
        return plan.buf

    def wait(self) -> None:
        """Block until done; a failed reduction raises CollectiveHangError naming the ranks that never
        reached it (or the backend's own error when there is nothing to diagnose)."""
        try:
            self.future.wait()
        except Exception:  # the callback kept the collective's own error
            if self.error is None:
                raise
        if self.error is not None:
            self._raise()

    def _raise(self) -> None:
        exc = self.error
        if not communication_failure(exc):
            raise exc
        err = self._watchdog.diagnose(_OP, self._seq, self._plan.nbytes, exc)
        if err is None:
            raise exc
        raise err from exc

