"""DDP whose gradient buckets go through npudist.comm: adapted, numbered and counted like any collective.

``npudist.ddp(model)`` wraps the model in torch's DistributedDataParallel and registers a comm hook
that hands each gradient bucket to npudist's asynchronous all_reduce. So a bucket the backend's
constraint row rejects (bf16 under ``hccl-strict``) is cast, padded and reduced in pooled buffers
instead of failing; every bucket takes a collective number, so a rank that never reaches its backward
is named in a CollectiveHangError; and comm.stats() counts the gradient traffic itself. What a bucket
needs is planned once per bucket buffer (bucket_call.py), so a step pays for issuing, not for planning.

Numerics: where the row reduces the bucket's dtype natively the hook does what DDP's default does
(scale by 1/world, then sum; in a power-of-two world the same bits come from scaling after the sum,
bucket_call.py), so parameters stay bit-for-bit those of plain DDP; otherwise it averages in the wider
dtype comm casts to and casts back once.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from npudist import comm
from npudist.comm import context
from npudist.comm.bucket_call import BucketCall, BucketPlan
from npudist.comm.nonfinite import NonFiniteFold
from npudist.comm.state import state
from npudist.comm.watched import communication_failure
from npudist.runtime import compat
from npudist.runtime.compat import DIST_ERRORS

_task_id = getattr(torch._C, "_current_graph_task_id", None)


class GradientSync:
    """The comm hook's state for one DDP model: what it has reduced, and a hook that replaced it."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.buckets = 0
        """Bucket reductions issued through npudist."""
        self.wait_seconds = 0.0
        """Issue-to-completion seconds of this model's finished buckets, summed; only grows (telemetry
        reads the increase per step as time spent waiting in gradient all-reduce)."""
        self.blocked_seconds = 0.0
        """Seconds the end of backward blocked on its buckets, summed: the all-reduce time not hidden behind
        backward (the step's communication phases, diagnosis/straggler/phases.py)."""
        self.replaced_by: tuple[Callable[..., Any], Any] | None = None
        """(hook, state) the user registered after npudist.ddp(); buckets then go to it instead."""
        self.plans: dict[int, BucketPlan] = {}
        """Bucket index -> the plan made for the buffer DDP showed under that index."""
        self.nonfinite: NonFiniteFold | None = None
        """The sentinel's flag (npudist/training/sentinel.py), folded into the last bucket of each backward."""
        self._pending: list[Any] = []
        self._futures: list[torch.futures.Future] = []
        self._task: object = None

    def plan(self, index: int, buf: torch.Tensor, ctx: context.GroupContext) -> BucketPlan:
        """A new plan for bucket ``index``: DDP built or rebuilt its buckets, or the constraints changed."""
        if index in self.plans:  # a new layout: drop every old plan (each holds its buffer)
            self.plans.clear()
        plan = self.plans[index] = BucketPlan(buf, self.group, ctx)
        return plan

    def _track(self, call: Any, future: torch.futures.Future) -> None:
        # A Python callback queued in backward runs before DDP's own finalizer (which DDP queues when the
        # last bucket is ready): there it waits for this backward's buckets, so a failed one raises
        # CollectiveHangError from loss.backward(). DDP's own wait would only see a RuntimeError's text.
        task = _task_id() if _task_id is not None else True
        if task != self._task:
            self._pending, self._futures = [], []  # a backward that failed before its callbacks ran
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            except RuntimeError:  # not inside a backward pass (DDP's join runs the hook directly)
                self._task = None
                return
            self._task = task
        self._pending.append(call)
        self._futures.append(future)

    def _finish_backward(self) -> None:
        pending, futures = self._pending, self._futures
        self._pending, self._futures, self._task = [], [], None
        blocked_at = time.perf_counter()
        try:
            torch.futures.wait_all(futures)
        except Exception:
            for call in pending:  # the first failed bucket, diagnosed
                call.wait()
            raise
        self.blocked_seconds += time.perf_counter() - blocked_at
        for call in pending:
            self.wait_seconds += call.seconds or 0.0
        if self.nonfinite is not None:
            self.nonfinite.reduced()


def _hook(sync: GradientSync, bucket):  # DDP checks these annotations: they must stay empty
    if sync.replaced_by is not None:
        hook, hook_state = sync.replaced_by
        return hook(hook_state, bucket)
    buf = bucket.buffer()
    ctx = context.get(sync.group)
    index = bucket.index()
    plan = sync.plans.get(index)
    if plan is None or plan.buf is not buf or plan.ctx is not ctx:
        plan = sync.plan(index, buf, ctx)
    sync.buckets += 1
    if sync.nonfinite is not None:
        sync.nonfinite.before_reduce(bucket, buf)
    if plan.fast:
        if plan.scale is not None:
            buf.mul_(plan.scale)  # DDP's default: scale by 1/world first, then sum
        call = BucketCall(plan, state().watchdog)
        future = call.future
    else:
        if plan.scale is not None:
            buf.mul_(plan.scale)
            op = "sum"
        else:
            op = "avg" if ctx.world > 1 else "sum"  # cast to the wider dtype, sum and divide there, cast back
        call = comm.all_reduce(buf, op, sync.group, async_op=True)  # numbered, adapted, counted
        future = call.get_future()
    sync._track(call, future)
    return future


class _NpudistDDP(DistributedDataParallel):
    """DistributedDataParallel whose register_comm_hook replaces npudist's hook (torch allows one), and whose
    forward-time collectives are numbered for hang diagnosis."""

    _npudist_sync: GradientSync

    def _pre_forward(self, *inputs: Any, **kwargs: Any) -> Any:
        # DDP talks over the group itself before the forward: the bucket rebuild after the first step
        # (reducer._rebuild_buckets broadcasts the new layout), buffer broadcasts, join notifications. They
        # go through torch.distributed directly, so the whole pre-forward takes one collective number as
        # "ddp_forward": a rank that stalls between steps leaves the others waiting in a numbered call.
        # Only a forward that can communicate takes a number (with gradients, or syncing buffers, or under
        # join): one rank evaluating alone under no_grad must not shift its numbers from the others'.
        sync_bufs = getattr(self, "_check_sync_bufs_pre_fwd", None)
        join = getattr(getattr(self, "_join_config", None), "enable", False)
        if not (torch.is_grad_enabled() or join or (sync_bufs is not None and sync_bufs())):
            return super()._pre_forward(*inputs, **kwargs)
        watchdog = state().watchdog
        seq = watchdog.enter("ddp_forward", 0)
        if torch.is_grad_enabled():
            watchdog.step_started()
        try:
            out = super()._pre_forward(*inputs, **kwargs)
        except DIST_ERRORS as exc:
            if not communication_failure(exc):
                raise
            err = watchdog.diagnose("ddp_forward", seq, 0, exc)
            if err is None:
                raise
            raise err from exc
        watchdog.done(seq)
        return out

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        self._check_comm_hook(hook)
        sync = self._npudist_sync
        if sync.replaced_by is None:
            warnings.warn(
                f"register_comm_hook({getattr(hook, '__qualname__', hook)}) replaces npudist.ddp's hook: "
                "gradient buckets are no longer adapted to the backend's constraints, numbered for hang "
                "diagnosis or counted in npudist.comm.stats()", stacklevel=2)
        sync.replaced_by = (hook, state)
        self._comm_hooks = [(hook, state)]
        if self.logger is not None:
            self.logger._set_comm_hook_name(getattr(hook, "__qualname__", str(hook)))


# DDP options whose gradients would not pass through a comm hook, or that register DDP's own hook.
_REFUSED = MappingProxyType({
    "mixed_precision": "registers DDP's own comm hook (a DDP model takes one); cast the model to the low "
                       "precision dtype instead (npudist adapts bf16/fp16 buckets) or use plain DDP",
    "delay_all_reduce_named_params": "has DDP all-reduce those parameters itself with torch.distributed, "
                                     "bypassing the comm hook; leave it out or use plain DDP",
    "param_to_hook_all_reduce": "goes with delay_all_reduce_named_params, which bypasses the comm hook; "
                                "leave it out or use plain DDP",
})


def _refuse(model: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    for name, why in _REFUSED.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"npudist.ddp: the DDP option {name}= {why}")
    for name, module in model.named_modules():
        if getattr(module, "sparse", False) is True:
            raise ValueError(
                f"npudist.ddp: module {name or 'model'!r} ({type(module).__name__}) has sparse=True: its "
                "gradients are sparse, and npudist's collectives take dense buckets; build it with "
                "sparse=False or use plain DDP")




def _refuse_unsyncable(model: torch.nn.Module, backend: str) -> None:
    """Before DDP(init_sync=) (torch 2.7) DDP broadcasts the start-up weights itself, bypassing npudist's
    adapting broadcast; gloo before torch 2.5 cannot move bfloat16 ("Invalid scalar type")."""
    if backend != "gloo" or compat.has("ddp_init_sync") or compat.has("gloo_bf16"):
        return
    if any(t.dtype == torch.bfloat16 for t in [*model.parameters(), *model.buffers()]):
        compat.require("gloo_bf16", "npudist.ddp of a bfloat16 model on gloo (DDP's own start-up broadcast; "
                       "or keep the model in float32 and autocast to bfloat16)")


def _copy_rank0_states(model: torch.nn.Module, group: Any) -> None:
    """DDP's start-up copy of rank 0's parameters and buffers, through npudist's adapting broadcast.

    DDP would broadcast them with torch.distributed directly (``_sync_module_states``), which a backend row
    may reject (bf16 under hccl-strict); the same tensors, skipping those DDP is told to ignore, go here.
    """
    ignored = set(getattr(model, "_ddp_params_and_buffers_to_ignore", ()))
    src = dist.get_global_rank(group, 0) if group is not None else 0
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name not in ignored:
                comm.broadcast(tensor.detach(), src=src, group=group)


def ddp(model: torch.nn.Module, **ddp_kwargs: Any) -> DistributedDataParallel:
    """``model`` on this rank's device inside DistributedDataParallel, its gradients reduced by npudist.

    ``ddp_kwargs`` go to DistributedDataParallel (find_unused_parameters, gradient_as_bucket_view,
    static_graph, bucket_cap_mb, ...); ``device_ids`` defaults to this rank's device (none on CPU).
    Options that cannot work through a comm hook raise ValueError naming them.
    """
    import torch.distributed as dist

    from npudist.runtime.state import peek

    rt = peek()
    ctx = rt.context if rt is not None and dist.is_initialized() else None
    if ctx is None:
        raise RuntimeError("npudist.ddp needs a process group: call npudist.init() first "
                           "(start the job with `npudist launch` or torchrun)")
    _refuse(model, ddp_kwargs)
    if ctx.device.type != "cpu":
        ddp_kwargs.setdefault("device_ids", [ctx.device])
    model = model.to(ctx.device)
    _refuse_unsyncable(model, ctx.backend)
    if ddp_kwargs.get("init_sync", True) and compat.has("ddp_init_sync"):
        _copy_rank0_states(model, ddp_kwargs.get("process_group"))
        ddp_kwargs["init_sync"] = False
    wrapped = _NpudistDDP(model, **ddp_kwargs)
    if ctx.accelerator.vendor.simulated:
        wrapped.logger = _UntimedLogger(wrapped.logger)
    if getattr(wrapped, "_use_python_reducer", False):
        raise ValueError(
            "npudist.ddp: torch._dynamo.config.optimize_ddp='python_reducer' calls comm hooks per parameter, "
            "not per bucket; use another optimize_ddp mode or plain DDP")
    sync = GradientSync(wrapped.process_group)
    wrapped._npudist_sync = sync
    DistributedDataParallel.register_comm_hook(wrapped, sync, _hook)
    return wrapped


class _UntimedLogger:
    """DDP's c10d Logger on the simulated NPU, without the sampled runtime stats.

    DDP's forward calls ``logger.set_runtime_stats_and_log()``, which times the step with a reducer timer
    registered per device type; torch registers one for CPU and CUDA only, so on the simulated ``npu``
    device every rank printed "Time stats are currently only collected for CPU and CUDA devices" from
    logger.cpp (a C++ warning, out of reach of Python's warning filters). Those stats are DDP's own
    logging data, which nothing in npudist reads; every other call goes to the real logger."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def set_runtime_stats_and_log(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


def gradient_sync(model: torch.nn.Module) -> GradientSync:
    """The comm hook state of a model made by ``npudist.ddp`` (ValueError for any other)."""
    sync = getattr(model, "_npudist_sync", None)
    if not isinstance(sync, GradientSync):
        raise ValueError(f"{type(model).__name__} was not made by npudist.ddp(); wrap the model with "
                         "npudist.ddp(model) instead of DistributedDataParallel")
    return sync


__all__ = ["GradientSync", "ddp", "gradient_sync"]
